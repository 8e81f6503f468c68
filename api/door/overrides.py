"""The admin API's changes to the catalogue, kept on top of the models file.

A catalogue is served as the file says with the admin's changes laid over it: the settings a
`PUT /admin/models/{name}` set and the versions a `DELETE .../versions/{v}` retired, until
`DELETE /admin/models/{name}/overrides` drops them all for that model. A
SIGHUP's re-read of the file lays them over it again; a cell's core also writes them beside
the file it reads, the supervisor's kept copy (`<models>.admin.json`, replaced atomically),
before they are served, so the core that starts after it lays them over the file too.
Otherwise a version retired because it answers wrong would come back by itself. A single
process keeps them in memory: beside the operator's own file they would outlive the server
and come back on a later start that nobody asked to keep them.

Which wins: the admin's change, until the file changes that same setting (its value in the
file is no longer the one it was when the admin set it) or retires that version itself; then
the file's. A setting PUT back to the file's value comes from the file again. An override
that names a model or version the file no longer holds, or that the file's new values make
invalid, is dropped and logged. Whatever is dropped is dropped from the kept file too.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from failover.fleet import Catalogue, CatalogueError, ModelConfig

log = logging.getLogger("batchgate.models")

SUFFIX = ".admin.json"  # the kept overrides, beside the models file
SETTINGS = ("default", "weights", "min_workers", "max_workers")  # what PUT may change


@dataclass(frozen=True, slots=True)
class Override:
    """A setting the admin set: `value`, over what the file said then (`file`)."""

    value: Any
    file: Any


@dataclass(slots=True)
class Laid:
    """The overrides laid over one file: what would be served, what stays, what is dropped."""

    file: Catalogue
    catalogue: Catalogue
    settings: dict[str, dict[str, Override]]
    retired: dict[str, set[str]]
    dropped: list[str]


class Overrides:
    """The admin's changes to one catalogue file, kept in `path` (None: in memory only,
    for `--model`, which has no file)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self.settings: dict[str, dict[str, Override]] = {}
        self.retired: dict[str, set[str]] = {}
        self.file: Catalogue | None = None  # the file the overrides were last laid over
        if path is not None:
            self._read(path)

    @classmethod
    def beside(cls, models: str | None) -> Overrides:
        return cls(None if models is None else Path(models + SUFFIX))

    def apply(self, file: Catalogue) -> Catalogue:
        """`file` with the overrides laid over it, taken at once (at start)."""
        laid = self.merged(file)
        self.take(laid)
        return laid.catalogue

    def merged(self, file: Catalogue) -> Laid:
        """`file` with the overrides laid over it; those the file has moved past or that no
        longer fit it are dropped. Changes nothing until `take`."""
        settings = {m: dict(kept) for m, kept in self.settings.items()}
        retired = {m: set(v) for m, v in self.retired.items()}
        dropped: list[str] = []
        models = dict(file.models)
        for name in sorted(set(settings) | set(retired)):
            model = file.models.get(name)
            if model is None:
                dropped.append(f"{name}: the file no longer has model {name}")
                settings.pop(name, None)
                retired.pop(name, None)
                continue
            models[name] = _model(model, settings.get(name, {}), retired.get(name, set()),
                                  dropped)
        return Laid(file, Catalogue(models), _tidy(settings), _tidy(retired), dropped)

    def bare(self, file: Catalogue, why: str) -> Laid:
        """`file` alone: every override dropped for `why`."""
        names = [f"{m}.{s}" for m, kept in self.settings.items() for s in kept]
        names += [f"{m}.versions.{v} retired" for m, vs in self.retired.items() for v in vs]
        return Laid(file, file, {}, {}, [f"{n}: {why}" for n in names])

    def take(self, laid: Laid) -> None:
        """Serve `laid`: its drops are logged and the kept copy rewritten without them."""
        self.file, self.settings, self.retired = laid.file, laid.settings, laid.retired
        for why in laid.dropped:
            log.warning("an admin change is dropped, the models file's value is served: %s",
                        why)
        if laid.dropped:
            try:
                self.save()
            except OSError as exc:
                log.error("the admin changes kept in %s were not rewritten: %s",
                          self._path, exc)

    def record(self, before: Catalogue, after: Catalogue, name: str) -> None:
        """Keep what the admin changed of `name` (from `before` to `after`) over the file;
        raises OSError, and then keeps nothing new, when it cannot be written."""
        file = self.file.models.get(name) if self.file is not None else None
        old, new = before.models[name], after.models[name]
        settings = {m: dict(kept) for m, kept in self.settings.items()}
        retired = {m: set(v) for m, v in self.retired.items()}
        kept = settings.setdefault(name, {})
        for setting in SETTINGS:
            value = _value(new, setting)
            if value == _value(old, setting):
                continue
            base = None if file is None else _value(file, setting)
            if file is not None and value == base:
                kept.pop(setting, None)  # back to the file's value: the file's again
            else:
                kept[setting] = Override(value, base)
        for version, config in new.versions.items():
            if config.retired and not old.versions[version].retired:
                retired.setdefault(name, set()).add(version)
        self._write(_tidy(settings), _tidy(retired))
        self.settings, self.retired = _tidy(settings), _tidy(retired)

    def forget(self, name: str) -> None:
        """Drop every change the admin made to `name`: the file's settings and versions
        are served for it again. Raises OSError, and then drops nothing, when the kept copy
        cannot be written."""
        settings = {m: kept for m, kept in self.settings.items() if m != name}
        retired = {m: versions for m, versions in self.retired.items() if m != name}
        self._write(settings, retired)
        self.settings, self.retired = settings, retired

    def set_by_admin(self, name: str) -> list[str]:
        """The settings of `name` the admin API set (the others are the file's)."""
        return [s for s in SETTINGS if s in self.settings.get(name, {})]

    def retired_by_admin(self, name: str, version: str) -> bool:
        return version in self.retired.get(name, set())

    def save(self) -> None:
        self._write(self.settings, self.retired)

    def _write(self, settings: dict[str, dict[str, Override]],
               retired: dict[str, set[str]]) -> None:
        """Write the overrides to `path` whole or not at all (OSError when it cannot)."""
        if self._path is None:
            return
        data = {"settings": {m: {s: {"value": o.value, "file": o.file} for s, o in kept.items()}
                             for m, kept in settings.items()},
                "retired": {m: sorted(v) for m, v in retired.items()}}
        new = self._path.with_name(self._path.name + ".new")
        try:
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
                out.flush()
                os.fsync(out.fileno())
            os.replace(new, self._path)
        except OSError:
            with contextlib.suppress(OSError):
                new.unlink()
            raise

    def _read(self, path: Path) -> None:
        try:
            data = orjson.loads(path.read_bytes())
            self.settings = {m: {s: Override(o["value"], o["file"]) for s, o in kept.items()
                                 if s in SETTINGS}
                             for m, kept in data.get("settings", {}).items()}
            self.retired = {m: set(v) for m, v in data.get("retired", {}).items()}
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
            log.error("the admin changes kept in %s cannot be read, the models file is served "
                      "as it is: %s", path, exc)
            self.settings, self.retired = {}, {}


def _model(model: ModelConfig, kept: dict[str, Override], retired: set[str],
           dropped: list[str]) -> ModelConfig:
    """`model` with its overrides, each kept only while it still fits the file; those
    dropped leave `kept` and `retired`, and say why in `dropped`."""
    name = model.name
    for setting, override in list(kept.items()):
        if _value(model, setting) != override.file:
            dropped.append(f"{name}.{setting}: the file changed it")
            del kept[setting]
            continue
        try:
            model = replace(model, **{setting: override.value})
        except CatalogueError as exc:
            dropped.append(f"{name}.{setting}: {exc}")
            del kept[setting]
    for version in sorted(retired):
        config, where = model.versions.get(version), f"{name}.versions.{version}"
        try:
            if config is None:
                raise LookupError(f"the file no longer has version {version}")
            if config.retired:
                raise LookupError("the file retires it itself")
            model = Catalogue({name: model}).retire(name, version).first
        except (LookupError, CatalogueError) as exc:
            dropped.append(f"{where}: {exc}")
            retired.discard(version)
    return model


def _tidy(table: dict[str, Any]) -> dict[str, Any]:
    return {m: v for m, v in table.items() if v}


def _value(model: ModelConfig, setting: str) -> Any:
    value = getattr(model, setting)
    return dict(value) if isinstance(value, Mapping) else value


__all__ = ["SETTINGS", "SUFFIX", "Laid", "Override", "Overrides"]
