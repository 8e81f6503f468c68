"""The catalogue of models changed while serving, in the core's process: the admin API
(`GET /admin/models`, `PUT /admin/models/{name}`, `DELETE
/admin/models/{name}/versions/{version}`, `DELETE /admin/models/{name}/overrides`) and
SIGHUP's re-read of `--models`.

Every change makes a new catalogue, checked as a file is, and hands it to the cores in a
turn of their owner taken at once; a change that would leave it invalid changes nothing and
says why. Only versions the
catalogue names can be loaded: nothing here takes a spec (a module path) from the network.
Answers are `(status, body)` pairs of plain values: in a cell they cross the link.
The admin's changes are kept on top of the file and laid over it again at each re-read
(`api.door.overrides`, which says which wins).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from api.door.overrides import SETTINGS, Overrides
from api.errors import ERRORS
from batcher import Clock
from failover.fleet import (
    GUARD_KEYS,
    Catalogue,
    CatalogueError,
    ModelConfig,
    ModelCores,
    check_change,
    check_fits,
    load_catalogue,
)

log = logging.getLogger("batchgate.models")

Answer = tuple[int, dict[str, Any]]


class ModelsAdmin:
    def __init__(self, cores: ModelCores, clock: Clock, workers: int,
                 path: str | None, change: Callable[[Callable[[float], None]], None],
                 refused: Callable[[], list[dict[str, Any]]] | None = None,
                 most: int | None = None, overrides: Overrides | None = None) -> None:
        """`path`: the catalogue file SIGHUP re-reads (None: `--model`, nothing to read);
        `change(apply)`: the core's owner applies `apply(now)` in a turn of its own
        (`CoreOwner.change`); `refused`: the files on disk a cell's supervisor refused
        (`file`, `reason`), served from the copies accepted before them; `workers` to
        `most` (None: `workers`): the pool's sizes, which every change must fit;
        `overrides`: the admin's changes kept over the file, already laid over the
        catalogue the cores serve (None: kept in memory only)."""
        self._cores, self._clock, self._workers = cores, clock, workers
        self._most = workers if most is None else most
        self._path, self._change = path, change
        self._refused = refused or list
        self._overrides = overrides or Overrides(None)
        if self._overrides.file is None:
            self._overrides.file = cores.catalogue

    def view(self) -> dict[str, Any]:
        """Each model's settings, and each version's state, workers and queue."""
        cores, overrides = self._cores, self._overrides
        states = {s.version: s for s in cores.versions(self._clock.now())}
        models = []
        for name, model in cores.catalogue.models.items():
            versions = []
            for short, config in model.versions.items():
                state = states.get(model.key(short))
                versions.append({
                    "version": short, "spec": config.spec,
                    "state": "retired" if config.retired else
                    (state.state if state is not None else "cold"),
                    "resident_workers": state.resident if state else 0,
                    "loading": state.loading if state else 0,
                    "queued": state.queued if state else 0,
                    "load_s": state.load_s if state else None,
                    "load_s_hint": config.load_s,
                    "start": state.start.value if state else None,
                    "start_s": {k.value: s for k, s in state.start_s.items()} if state
                    else {},
                    "retired_by_admin": overrides.retired_by_admin(name, short),
                })
            models.append({
                "name": name, "default": model.default,
                "serving_default": cores.serving_default(name),
                "weights": dict(model.weights), "min_workers": model.min_workers,
                "max_workers": model.max_workers, "idle_unload_s": model.idle_unload_s,
                **{k: v for k, v in model.to_dict().items() if k in GUARD_KEYS},
                "versions": versions, "set_by_admin": overrides.set_by_admin(name),
            })
        abandoned = {name: target.version for name, target in cores.abandoned().items()}
        return {"models": models, "refused_files": self._refused(),
                "rollouts_abandoned": abandoned}

    def states(self) -> dict[str, str]:
        """Each live version's state, for /readyz."""
        return {str(s.version): s.state for s in self._cores.versions(self._clock.now())}

    def call(self, method: str, name: str | None, version: str | None, body: bytes
             ) -> Answer:
        """One admin request, routed by method and path parts: DELETE with a `version`
        retires it, DELETE with a `name` alone drops the admin's changes to that model
        (`DELETE /admin/models/{name}/overrides`)."""
        try:
            if method == "GET":
                return 200, self.view()
            if method == "PUT" and name is not None and version is None:
                return self._apply(self._put(name, body), name)
            if method == "DELETE" and name is not None and version is not None:
                serving = self._serving(name, version)
                if serving is not None:
                    return _refuse("version_serving", serving)
                return self._apply(self._cores.catalogue.retire(name, version), name)
            if method == "DELETE" and name is not None:
                return self._forget(name)
        except CatalogueError as exc:
            return _refuse("invalid_change", str(exc))
        except LookupError as exc:
            return _refuse("not_found", str(exc.args[0] if exc.args else exc))
        except ValueError as exc:
            return _refuse("invalid_request", str(exc))
        return _refuse("method_not_allowed", f"{method} is not taken here")

    def _put(self, name: str, body: bytes) -> Catalogue:
        try:
            data = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not set(data) <= set(SETTINGS) or not data:
            raise ValueError(f"the body is an object of one or more of {', '.join(SETTINGS)}")
        return self._cores.catalogue.with_settings(name, **data)

    def _serving(self, name: str, version: str) -> str | None:
        """Why `version` of `name` may not be retired yet, while requests still go to it
        (None: none do but those naming it, or it is the default, which `retire` refuses):
        retired, its traffic would go to a version that may not be loaded."""
        model = self._cores.catalogue.models.get(name)
        if model is None or version == model.default or version not in model.live():
            return None
        if self._cores.serving_default(name) == version:
            return (f"{version} still serves {name}'s requests that name no version: the "
                    f"rollout to {model.default} has not taken over yet; retire {version} "
                    f"once GET /admin/models shows serving_default {model.default}")
        share = model.weights.get(version, 0)
        if share:
            return (f"{version} carries {share}% of {name}'s requests by weight (each "
                    f"Idempotency-Key sticks to its version): set its weight to 0 first "
                    f"(PUT /admin/models/{name} {_without(model, version)}), then retire it")
        return None

    def _check(self, catalogue: Catalogue) -> None:
        """What every new catalogue must pass, from the admin API or the file."""
        check_change(self._cores.catalogue, catalogue)
        check_fits(catalogue, self._workers, self._most)

    def _apply(self, catalogue: Catalogue, name: str,
               keep: Callable[[], None] | None = None) -> Answer:
        """Serve `catalogue`, changed in `name`, once the change is kept (`keep`; by
        default the admin's change recorded over the file)."""
        self._check(catalogue)
        try:  # kept before it is served: a change served is a change that lasts
            if keep is None:
                self._overrides.record(self._cores.catalogue, catalogue, name)
            else:
                keep()
        except OSError as exc:
            log.error("an admin change to %s was not kept, nothing changed: %s", name, exc)
            return _refuse("change_not_kept", f"the change could not be kept ({exc}); "
                           "nothing changed")
        self._serve(catalogue)
        return 200, self.view()

    def _forget(self, name: str) -> Answer:
        """Serve `name` as the file says: every setting the admin set and every version
        the admin retired goes back to the file's (a version brought back is cold: it loads
        when asked for, or as its weight or default needs it)."""
        served, file = self._cores.catalogue, self._overrides.file
        if name not in served.models or file is None or name not in file.models:
            raise LookupError(f"no model {name!r} in the catalogue")
        catalogue = Catalogue({**served.models, name: file.models[name]})
        return self._apply(catalogue, name, lambda: self._overrides.forget(name))

    def _serve(self, catalogue: Catalogue) -> None:
        cores = self._cores
        self._change(lambda now: cores.set_catalogue(catalogue, now))

    def reload(self) -> None:
        """SIGHUP: serve the file as it is now, the admin's changes laid over it; one that
        fails to load changes nothing."""
        if self._path is None:
            return
        try:
            file = load_catalogue(self._path)
            laid = self._overrides.merged(file)
            try:
                self._check(laid.catalogue)
            except CatalogueError as exc:  # the file wins: served alone if it passes
                laid = self._overrides.bare(file, f"they do not fit the new file ({exc})")
                self._check(file)
        except (CatalogueError, OSError) as exc:
            log.error("the models file %s was not reloaded, nothing changed: %s",
                      self._path, exc)
            return
        self._overrides.take(laid)
        catalogue = laid.catalogue
        self._serve(catalogue)
        log.info("models reloaded from %s: %s", self._path,
                 ", ".join(catalogue.versions()))


def _without(model: ModelConfig, version: str) -> str:
    """The weights body that gives `version`'s share to the default."""
    weights = {v: w for v, w in model.weights.items() if v != version}
    weights[model.default] = weights.get(model.default, 0) + model.weights.get(version, 0)
    return orjson.dumps({"weights": weights}).decode()


def _refuse(code: str, message: str) -> Answer:
    return ERRORS[code].status, {"error": {"code": code, "message": message}}


__all__ = ["ModelsAdmin"]
