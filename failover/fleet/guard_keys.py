"""The catalogue's keys for guard stages: which guard models run on a model's inputs before
it (`pre`) and on its outputs after it (`post`), how, and what a guard that cannot answer
means (docs/guards.md).

A guard is a model of the same catalogue, with versions and workers of its own. It may not
be guarded itself: a chain would run guards of guards inside one request's deadline, and
a cycle would never end. The checks here return the first problem as (key path, why), and
the catalogue raises it, so that a model built in code is held to what a file is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from batcher import Tier

GUARD_KEYS = ("pre", "post", "guard_mode", "on_guard_failure", "guard_timeout_ms",
              "with_input")
GUARD_MODES = ("sequential", "parallel")  # parallel: pre guards run beside the model
FAILURE_MODES = ("closed", "open")  # open: an input whose guard cannot answer goes through
TIERS = tuple(tier.label for tier in Tier)
GUARD_TIMEOUT_S = 0.3
GUARD_TIMEOUT_MAX_S = 60.0  # past this a guard is no longer a share of a request's deadline
_SHOWN = 64  # characters of a name quoted back in an error

Problem = tuple[str, str]  # (key path, why)


class Guarded(Protocol):
    """What the checks read of a model (`ModelConfig`)."""

    @property
    def name(self) -> str: ...
    @property
    def pre(self) -> tuple[str, ...]: ...
    @property
    def post(self) -> tuple[str, ...]: ...
    @property
    def guard_mode(self) -> str: ...
    @property
    def on_guard_failure(self) -> Mapping[str, str]: ...
    @property
    def guard_timeout_s(self) -> float: ...
    @property
    def with_input(self) -> bool: ...


def read_guard_keys(table: Mapping[str, Any]) -> dict[str, Any]:
    """A model's keyword arguments for the guard keys its file table holds (None: absent);
    the model checks the values."""
    out = {key: table[key] for key in GUARD_KEYS if table.get(key) is not None}
    if "guard_timeout_ms" in out:
        ms = out.pop("guard_timeout_ms")
        out["guard_timeout_s"] = ms / 1000 if _is_number(ms) else ms
    return out


def guard_timeout_ms(seconds: float) -> float:
    """The file's value of a guard timeout (milliseconds) for the model's seconds."""
    return round(seconds * 1000, 6)


def failure_modes(value: Any) -> Any:
    """Tier label -> mode from "closed" or "open" (every tier) or a table of tiers (a tier
    left out: closed); any other value as it is, for the check to name."""
    if isinstance(value, str) and value in FAILURE_MODES:
        return dict.fromkeys(TIERS, value)
    if isinstance(value, Mapping):
        return {**dict.fromkeys(TIERS, "closed"), **value}
    return value


def guard_problem(m: Guarded) -> Problem | None:
    """The first problem of a model's own guard keys; the catalogue checks the names
    against its models (`chain_problem`)."""
    path = f"models.{m.name}"
    problem = _names_problem(m, "pre") or _names_problem(m, "post")
    if problem is not None:
        return problem
    if not isinstance(m.guard_mode, str) or m.guard_mode not in GUARD_MODES:
        return f"{path}.guard_mode", f"{m.guard_mode!r} is not sequential or parallel"
    problem = _failure_problem(m.on_guard_failure, f"{path}.on_guard_failure")
    if problem is not None:
        return problem
    seconds = m.guard_timeout_s
    if not _is_number(seconds) or not 0 < seconds <= GUARD_TIMEOUT_MAX_S:
        shown = f"{seconds * 1000:g}" if _is_number(seconds) else repr(seconds)
        return f"{path}.guard_timeout_ms", (
            f"{shown} is not a number of milliseconds > 0 and at most "
            f"{GUARD_TIMEOUT_MAX_S * 1000:g}")
    if not isinstance(m.with_input, bool):
        return f"{path}.with_input", f"{m.with_input!r} is not true or false"
    return None


def chain_problem(models: Mapping[str, Guarded]) -> Problem | None:
    """The first guard named that is no model of `models`, or that has guards itself."""
    for name, model in models.items():
        for key in ("pre", "post"):
            for i, guard in enumerate(getattr(model, key)):
                path = f"models.{name}.{key}[{i}]"
                held = models.get(guard)
                if held is None:
                    return path, (f"{_shown(guard)} is no model of this catalogue: a guard "
                                  f"is one of its models (models: {', '.join(models)})")
                if held.pre or held.post:
                    return path, (f"{guard} has guards of its own (models.{guard}.pre, "
                                  f"post): guards do not chain; a model used as a guard "
                                  "may have no pre or post")
    return None


def _names_problem(m: Guarded, key: str) -> Problem | None:
    path = f"models.{m.name}.{key}"
    names = getattr(m, key)
    if not isinstance(names, tuple):
        return path, f"expected a list of model names, got {type(names).__name__}"
    for i, name in enumerate(names):
        if not isinstance(name, str):
            return f"{path}[{i}]", f"{name!r} is not a model name"
        if name == m.name:
            return f"{path}[{i}]", f"{m.name} cannot guard itself"
        if name in names[:i]:
            return f"{path}[{i}]", f"{name} is named twice"
    return None


def _failure_problem(modes: Any, path: str) -> Problem | None:
    if not isinstance(modes, Mapping):
        return path, (f"{modes!r} is not closed, open or a table of tiers "
                      f"({', '.join(f'{t} = ...' for t in TIERS)})")
    for tier, mode in modes.items():
        if tier not in TIERS:
            return f"{path}.{tier}", f"unknown tier (expected: {', '.join(TIERS)})"
        if not isinstance(mode, str) or mode not in FAILURE_MODES:
            return f"{path}.{tier}", f"{mode!r} is not closed or open"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        not math.isnan(value)


def _shown(name: Any) -> str:
    if not isinstance(name, str) or len(name) <= _SHOWN:
        return repr(name)
    return repr(name[:_SHOWN]) + "..."


__all__ = ["FAILURE_MODES", "GUARD_KEYS", "GUARD_MODES", "GUARD_TIMEOUT_MAX_S",
           "GUARD_TIMEOUT_S", "TIERS", "Guarded", "Problem", "chain_problem",
           "failure_modes", "guard_problem", "guard_timeout_ms", "read_guard_keys"]
