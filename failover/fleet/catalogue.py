"""The catalogue: which models and versions may be served, and which version a request gets.

Read from TOML (`--models FILE`, see examples/models.toml) or made from `--model SPEC` (one
model named "default", version "v1"). A version is named by its `VersionKey`
("model@version"): names hold 1 to 64 letters, digits, `_`, `.` and `-`, as a request may name
them. Every object here is frozen: a change made while serving (`with_settings`, `retire`)
returns a new catalogue, checked as a file is, so whoever holds the old one never sees half a
change; a catalogue that replaces another (`check_change`) keeps each version's spec, so a
version's name always means one function. Whether a pool can place it is
`failover.fleet.fitting`'s question. A model may name guard models of the same catalogue
that run on its inputs and outputs (`pre`, `post`: `failover.fleet.guard_keys`).

A request without "@version" gets its model's weighted choice, or its default without
weights. The default need not carry weight: it is the version that may not be retired and
the one a retired version's share falls back to. The choice is sticky: a request with an
Idempotency-Key gets a version from a keyed hash of it, the same in every process, so
retries, replays and re-routes of that request land on the same version.

Errors:

    CatalogueError (BatchgateError, ValueError)  parsing, loading or a change: the message
                                                 names the key path ("invalid_request")
    NotInCatalogue (LookupError)  resolve/config_of/a change: no such model or live version;
                                  the core answers it as failover.UnknownModel
"""

from __future__ import annotations

import hashlib
import math
import random
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from batcher import NAME_MAX, BatchgateError, VersionKey
from failover.fleet.guard_keys import (
    GUARD_KEYS,
    GUARD_TIMEOUT_S,
    chain_problem,
    failure_modes,
    guard_problem,
    guard_timeout_ms,
    read_guard_keys,
)
from gpu_pool import validate_spec

_MODEL_KEYS = ("default", "weights", "min_workers", "max_workers", "idle_unload_s", "versions",
               *GUARD_KEYS)
_VERSION_KEYS = ("spec", "load_s", "retired", "start")
# How a version's workers start: forked from the launcher, its function looked up there
# first (a user's that opts in), or afresh.
STARTS = ("fork", "preload", "spawn")
_PERSON = b"batchgate.models"  # keys the sticky hash apart from other hashes of the same key
_SHOWN = 64  # characters of a requested name quoted back in an error
_RANDOM = random.SystemRandom()  # unkeyed draws: no state shared by forked processes


class CatalogueError(BatchgateError, ValueError):
    """A catalogue file, or a change to a catalogue, is invalid; the message says where."""

    code = "invalid_request"  # only a change sent to the admin API reaches a client


class NotInCatalogue(LookupError):
    """Raised by `resolve`, `config_of` and changes: the name is no model or live version."""


@dataclass(frozen=True, slots=True)
class VersionConfig:
    """One version of a model; checked when a `ModelConfig` holds it."""

    name: str
    spec: str  # as --model takes it: minilm, sim, module:function
    load_s: float | None = None  # a hint of the load time until one has been measured
    retired: bool = False  # takes no new requests; its queue finishes, then it is unloaded
    start: str = "fork"  # "spawn": never forked; "preload": a user's function held by it

    def __post_init__(self) -> None:
        if _is_seconds(self.load_s):  # a bad one is refused, with its path, by its model
            object.__setattr__(self, "load_s", float(self.load_s))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A model as clients name it, and its versions; checked on construction."""

    name: str
    default: str  # the version a request without @version gets when there are no weights
    versions: Mapping[str, VersionConfig]
    weights: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    min_workers: int = 1  # kept resident; 0: may go cold after idle_unload_s
    max_workers: int | None = None  # None: no cap
    idle_unload_s: float = 600.0
    pre: tuple[str, ...] = ()  # guard models run on each input before it, in order
    post: tuple[str, ...] = ()  # guard models run on each output before it leaves, in order
    guard_mode: str = "sequential"  # or "parallel": pre guards run beside it, its answer held
    # tier label -> "closed" (an input whose guard cannot answer is refused) or "open"
    on_guard_failure: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType(failure_modes("closed")))
    guard_timeout_s: float = GUARD_TIMEOUT_S  # a guard's own share of the deadline
    with_input: bool = False  # as a post guard: gets {"input", "output"}, not the output alone

    def __post_init__(self) -> None:
        for key in ("pre", "post"):  # a list, as a file holds it, is a tuple here
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        object.__setattr__(self, "on_guard_failure", failure_modes(self.on_guard_failure))
        _check_model(self)
        object.__setattr__(self, "versions", MappingProxyType(dict(self.versions)))
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "on_guard_failure", MappingProxyType(dict(self.on_guard_failure)))
        object.__setattr__(self, "idle_unload_s", float(self.idle_unload_s))
        object.__setattr__(self, "guard_timeout_s", float(self.guard_timeout_s))

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce(self)

    def key(self, version: str) -> VersionKey:
        """The key of one of its versions."""
        return VersionKey.of(self.name, version)

    @property
    def default_key(self) -> VersionKey:
        return VersionKey.of(self.name, self.default)

    def live(self) -> tuple[str, ...]:
        """The names of its versions that take new requests, in order."""
        return tuple(v for v, config in self.versions.items() if not config.retired)

    def fails_open(self, tier_label: str) -> bool:
        """Whether an input of that tier whose guard cannot answer goes through unguarded."""
        return self.on_guard_failure[tier_label] == "open"

    def to_dict(self) -> dict[str, Any]:
        versions = {v: {"spec": c.spec, "load_s": c.load_s, "retired": c.retired,
                        "start": c.start}
                    for v, c in self.versions.items()}
        return {"default": self.default, "weights": dict(self.weights),
                "min_workers": self.min_workers, "max_workers": self.max_workers,
                "idle_unload_s": self.idle_unload_s, "pre": list(self.pre),
                "post": list(self.post), "guard_mode": self.guard_mode,
                "on_guard_failure": dict(self.on_guard_failure),
                "guard_timeout_ms": guard_timeout_ms(self.guard_timeout_s),
                "with_input": self.with_input, "versions": versions}


@dataclass(frozen=True, slots=True)
class Catalogue:
    """Models by name, in order: the first is the one a request without "model" gets."""

    models: Mapping[str, ModelConfig]

    def __post_init__(self) -> None:
        if not isinstance(self.models, Mapping) or not self.models:
            _fail("models", "the catalogue needs at least one model")
        for name, model in self.models.items():
            if not isinstance(model, ModelConfig) or model.name != name:
                _fail(f"models.{name}", "holds another model's configuration")
        problem = chain_problem(self.models)
        if problem is not None:
            _fail(*problem)
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce(self)

    @classmethod
    def single(cls, spec: str) -> Catalogue:
        """The catalogue `--model SPEC` means: model "default", version "v1" (key default@v1)."""
        try:
            validate_spec(spec)
        except ValueError as exc:
            raise CatalogueError(f"--model: {exc}") from exc
        return cls({"default": ModelConfig("default", "v1", {"v1": VersionConfig("v1", spec)})})

    @classmethod
    def from_dict(cls, data: Any) -> Catalogue:
        """Build from the TOML's shape (or `to_dict`'s; None there means absent). Raises
        CatalogueError naming the key path of the first problem, unknown keys included."""
        table = _table(data, "catalogue")
        _known(table, ("models",), "")
        models = _table(table.get("models", {}), "models")
        return cls({name: _model(name, value) for name, value in models.items()})

    @property
    def first(self) -> ModelConfig:
        return next(iter(self.models.values()))

    def is_guard(self, name: str) -> bool:
        """Whether some model names `name` in its pre or post."""
        return any(name in m.pre or name in m.post for m in self.models.values())

    def versions(self) -> tuple[VersionKey, ...]:
        """Every live version key, models in order, each model's versions in order."""
        return tuple(m.key(v) for m in self.models.values() for v in m.live())

    def config_of(self, key: VersionKey) -> tuple[ModelConfig, VersionConfig]:
        """The model and version of a key, a retired version's too (its queue still drains);
        raises NotInCatalogue."""
        model = self.models.get(key.model)
        if model is None or key.version not in model.versions:
            raise NotInCatalogue(f"{_shown(key)} is no version key of this catalogue")
        return model, model.versions[key.version]

    def resolve(self, requested: str | None, sticky: str | None = None, *,
                rng: random.Random | None = None) -> VersionKey:
        """The version key a request gets: None -> the first model; "m" -> its weighted
        choice (sticky per `sticky`, the request's Idempotency-Key), or its default without
        weights; "m@v" -> that version while it is live. Raises NotInCatalogue."""
        if requested is None:
            model = self.first
        else:
            name, at, version = requested.partition("@")
            model = self._model(name)
            if at:
                config = model.versions.get(version)
                if config is None or config.retired:
                    raise NotInCatalogue(f"model {name} has no live version {_shown(version)} "
                                       f"(live: {', '.join(model.live())})")
                return model.key(version)
        if not model.weights:
            return model.default_key
        return model.key(choose(model.weights, sticky, rng))

    def with_settings(self, model: str, *, default: str | None = None,
                      weights: Mapping[str, int] | None = None, min_workers: int | None = None,
                      max_workers: int | None = None) -> Catalogue:
        """A new catalogue with `model`'s settings changed, checked as a file is. None
        leaves a setting as it is: `weights={}` removes the weights; a cap is lifted by one
        at least the pool's size. Raises NotInCatalogue, CatalogueError."""
        m = self._model(model)
        return self._with(replace(
            m, default=m.default if default is None else default,
            weights=m.weights if weights is None else weights,
            min_workers=m.min_workers if min_workers is None else min_workers,
            max_workers=m.max_workers if max_workers is None else max_workers))

    def retire(self, model: str, version: str) -> Catalogue:
        """A new catalogue where `version` takes no new requests; its weight goes to the
        default. Retiring a retired version changes nothing. Raises NotInCatalogue, and
        CatalogueError for the default (the last live version is always the default)."""
        config = self._model(model)
        held = config.versions.get(version)
        if held is None:
            raise NotInCatalogue(f"model {model} has no version {_shown(version)}")
        if held.retired:
            return self
        if version == config.default:
            last = len(config.live()) == 1
            why = (f"it is the last live version of {model}; add a version and make it the "
                   "default first") if last else (
                   f"it is the default of {model}; make another version the default first")
            _fail(f"models.{model}.versions.{version}", f"cannot retire {version}: {why}")
        weights = {v: w for v, w in config.weights.items() if v != version}
        share = config.weights.get(version, 0)
        if weights and share:
            weights[config.default] = weights.get(config.default, 0) + share
        versions = {**config.versions, version: replace(held, retired=True)}
        return self._with(replace(config, versions=versions, weights=weights))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view in the file's shape (None for an absent setting)."""
        return {"models": {name: m.to_dict() for name, m in self.models.items()}}

    def _model(self, name: str) -> ModelConfig:
        model = self.models.get(name)
        if model is None:
            raise NotInCatalogue(f"model {_shown(name)} is not served "
                               f"(models: {', '.join(self.models)})")
        return model

    def _with(self, model: ModelConfig) -> Catalogue:
        return Catalogue({**self.models, model.name: model})


def choose(weights: Mapping[str, int], sticky: str | None,
           rng: random.Random | None = None) -> str:
    """A version drawn by `weights` (versions in name order, so equal weights choose alike
    whatever order they were written in). With `sticky` the draw is a keyed blake2b of it,
    the same in every process (Python's hash is salted per process); without, random."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("weights carry no weight")
    if sticky is None:
        point = (rng or _RANDOM).randrange(total)
    else:
        digest = hashlib.blake2b(sticky.encode("utf-8", "surrogatepass"), digest_size=8,
                                 person=_PERSON).digest()
        point = int.from_bytes(digest, "big") % total
    for version in sorted(weights):
        point -= weights[version]
        if point < 0:
            return version
    raise AssertionError("unreachable: point < total")


def check_change(old: Catalogue, new: Catalogue) -> None:
    """Raise CatalogueError if `new` gives a version `old` holds another spec: the workers
    holding it would answer from two functions under one name. A new spec is a new version."""
    for name, model in new.models.items():
        before = old.models.get(name)
        for short, config in model.versions.items():
            held = None if before is None else before.versions.get(short)
            if held is not None and held.spec != config.spec:
                _fail(f"models.{name}.versions.{short}.spec",
                      f"changed from {held.spec!r} to {config.spec!r}: a version's spec never "
                      "changes under its name; add the new spec as a new version (and make "
                      "it the default)")


def parse_catalogue(text: str) -> Catalogue:
    """A catalogue from TOML text; raises CatalogueError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(f"not valid TOML: {exc}") from exc
    return Catalogue.from_dict(data)


def load_catalogue(path: str | PathLike[str]) -> Catalogue:
    """A catalogue from a TOML file; raises CatalogueError (a missing or unreadable file
    too), its message opening with the file's name."""
    try:
        return parse_catalogue(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, CatalogueError) as exc:
        raise CatalogueError(f"models file {path}: {exc}") from exc


def _model(name: str, data: Any) -> ModelConfig:
    path = f"models.{name}"
    table = _table(data, path)
    _known(table, _MODEL_KEYS, path)
    versions = {v: _version(v, value, f"{path}.versions.{v}")
                for v, value in _table(_get(table, "versions", {}), f"{path}.versions").items()}
    default = _get(table, "default", next(iter(versions)) if len(versions) == 1 else None)
    if default is None:
        _fail(f"{path}.default", "missing: which version a request without @version gets")
    return ModelConfig(name, default, versions,
                       weights=_table(_get(table, "weights", {}), f"{path}.weights"),
                       min_workers=_get(table, "min_workers", 1),
                       max_workers=_get(table, "max_workers", None),
                       idle_unload_s=_get(table, "idle_unload_s", 600.0),
                       **read_guard_keys(table))


def _version(name: str, data: Any, path: str) -> VersionConfig:
    table = _table(data, path)
    _known(table, _VERSION_KEYS, path)
    if _get(table, "spec", None) is None:
        _fail(f"{path}.spec", "missing: minilm, sim or module:function")
    return VersionConfig(name, table["spec"], _get(table, "load_s", None),
                         _get(table, "retired", False), _get(table, "start", "fork"))


def _check_model(m: ModelConfig) -> None:
    path = f"models.{m.name}"
    _check_name(m.name, "models", "model")
    if not isinstance(m.versions, Mapping) or not m.versions:
        _fail(f"{path}.versions", "a model needs at least one version")
    for name, version in m.versions.items():
        _check_version(name, version, f"{path}.versions")
    if not isinstance(m.default, str) or m.default not in m.versions:
        _fail(f"{path}.default", f"{m.default!r} is not a version of {m.name} "
                                 f"(versions: {', '.join(m.versions)})")
    if m.versions[m.default].retired:
        _fail(f"{path}.default", f"{m.default} is retired")
    _check_weights(m, f"{path}.weights")
    if not _is_int(m.min_workers) or m.min_workers < 0:
        _fail(f"{path}.min_workers", f"{m.min_workers!r} is not a whole number >= 0")
    floor = max(1, m.min_workers)
    if m.max_workers is not None and (not _is_int(m.max_workers) or m.max_workers < floor):
        _fail(f"{path}.max_workers", f"{m.max_workers!r} is not a whole number >= {floor} "
                                     "(at least 1 and at least min_workers)")
    if not _is_seconds(m.idle_unload_s):
        _fail(f"{path}.idle_unload_s", f"{m.idle_unload_s!r} is not a number of seconds > 0")
    problem = guard_problem(m)
    if problem is not None:
        _fail(*problem)


def _check_version(name: str, version: Any, path: str) -> None:
    _check_name(name, path, "version")
    if not isinstance(version, VersionConfig) or version.name != name:
        _fail(f"{path}.{name}", "holds another version's configuration")
    if not isinstance(version.spec, str):
        _fail(f"{path}.{name}.spec", f"{version.spec!r} is not a string")
    try:
        validate_spec(version.spec)
    except ValueError as exc:
        _fail(f"{path}.{name}.spec", str(exc))
    if version.load_s is not None and not _is_seconds(version.load_s):
        _fail(f"{path}.{name}.load_s", f"{version.load_s!r} is not a number of seconds > 0")
    if not isinstance(version.retired, bool):
        _fail(f"{path}.{name}.retired", f"{version.retired!r} is not true or false")
    if version.start not in STARTS:
        _fail(f"{path}.{name}.start", f"{version.start!r} is not one of {', '.join(STARTS)}")


def _check_weights(m: ModelConfig, path: str) -> None:
    if not isinstance(m.weights, Mapping):
        _fail(path, "expected a table of version = percent")
    if not m.weights:
        return
    for version, weight in m.weights.items():
        if version not in m.versions:
            _fail(path, f"{version} is not a version of {m.name}")
        if m.versions[version].retired:
            _fail(path, f"{version} is retired")
        if not _is_int(weight) or weight < 0:
            _fail(path, f"{version} = {weight!r} is not a whole percent >= 0")
    if sum(m.weights.values()) != 100:
        _fail(path, f"the weights add up to {sum(m.weights.values())}, not 100")


def _check_name(name: Any, path: str, what: str) -> None:
    """A name a request can spell: a longer one would be served and never reached."""
    if isinstance(name, str) and VersionKey.is_name(name):
        return
    if not isinstance(name, str):
        _fail(path, f"{name!r} is not a {what} name")
    size = (f"; it has {len(name)} characters: no request could name it"
            if len(name) > NAME_MAX else "")
    _fail(path, f"{_shown(name)} is not a {what} name (1 to {NAME_MAX} letters, digits, "
                f"_ . -{size})")


def _table(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _fail(path, f"expected a table, got {type(value).__name__}")
    return value


def _known(table: Mapping[str, Any], allowed: tuple[str, ...], path: str) -> None:
    for name in table:
        if name not in allowed:
            where = f"{path}.{name}" if path else str(name)
            _fail(where, f"unknown key (expected: {', '.join(allowed)})")


def _get(table: Mapping[str, Any], name: str, default: Any) -> Any:
    value = table.get(name)
    return default if value is None else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _shown(name: str) -> str:
    return repr(name) if len(name) <= _SHOWN else repr(name[:_SHOWN]) + "..."


def _fail(path: str, why: str) -> NoReturn:
    raise CatalogueError(f"{path}: {why}")


def _reduce(obj: ModelConfig | Catalogue) -> tuple[Any, ...]:
    """Pickle a frozen catalogue object (a MappingProxyType is not picklable) as the
    arguments that build it again, checked again."""
    values = (getattr(obj, f.name) for f in fields(obj))
    return type(obj), tuple(dict(v) if isinstance(v, Mapping) else v for v in values)


__all__ = ["Catalogue", "CatalogueError", "ModelConfig", "NotInCatalogue", "VersionConfig",
           "check_change", "choose", "load_catalogue", "parse_catalogue"]
