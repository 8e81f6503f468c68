"""Which version a request gets, and how a model's new default takes over (rollouts).

The catalogue says what may be served and how a request chooses (`Catalogue.resolve`);
this adds what serving changes: a model's new default takes effect for requests naming no
version and carrying no weights once it is resident on as many workers as the old, or
after `ROLLOUT_TIMEOUT_S` once it is resident at all (the composite core asks, `rolled`, and
makes the switches). A rollout whose target's loads keep failing is abandoned: the old
default keeps serving, and the same target is not rolled out again until the catalogue
names another default (or the target loads after all).
It also keeps who asked for a version lately: its last arrival, and the Retry-After a
refused request was told while the version was cold (until then the refusal asks for the
load, as an arrival would).
"""

from __future__ import annotations

import math

from batcher import VersionKey
from failover import UnknownModel
from failover.fleet.catalogue import Catalogue

ROLLOUT_TIMEOUT_S = 300.0  # a new default resident on fewer workers than the old takes over


class Versions:
    def __init__(self, catalogue: Catalogue) -> None:
        self._effective: dict[str, VersionKey] = {}  # model -> the default requests get now
        self._rollout_since: dict[str, float] = {}
        self._last_arrival: dict[VersionKey, float] = {}
        self._promised: dict[VersionKey, float] = {}  # cold versions: the Retry-After told, until
        self.abandoned: dict[str, VersionKey] = {}  # model -> the target its rollout gave up
        self._overdue: set[str] = set()  # rollouts past their timeout, waiting for a worker
        self.catalogue = catalogue
        self._live: frozenset[VersionKey] = frozenset()
        self._only: VersionKey | None = None
        self.change(catalogue, 0.0)

    def change(self, catalogue: Catalogue, now: float, known: frozenset[VersionKey] = frozenset()
               ) -> None:
        """Serve `catalogue` from now on. `known`: the versions with a core already (a
        default whose core is gone takes effect at once)."""
        self.catalogue = catalogue
        self._live = frozenset(catalogue.versions())
        for name, model in catalogue.models.items():
            target = model.default_key
            current = self._effective.get(name)
            if self.abandoned.get(name) not in (None, target):
                del self.abandoned[name]  # another default asked for: a rollout of its own
            if current is None or current not in self._live or (known and current not in known):
                self._effective[name] = target
            elif current != target and self.abandoned.get(name) != target:
                self._rollout_since.setdefault(name, now)
        for name in [n for n in self._effective if n not in catalogue.models]:
            del self._effective[name]
            self._rollout_since.pop(name, None)
            self._overdue.discard(name)
            self.abandoned.pop(name, None)
        self._only = self._the_only()

    def _the_only(self) -> VersionKey | None:
        """The version every request without `model` gets, when nothing can change it:
        resolving is then one comparison (the one-model case, on the hot path)."""
        first = next(iter(self.catalogue.models.values()))
        if first.weights or self._rollout_since:
            return None
        return self._effective[first.name]

    # -- requests --------------------------------------------------------------------------
    def resolve(self, model: str | None, sticky: str | None) -> VersionKey:
        """The version a request runs on (raises UnknownModel): what the catalogue says,
        except that a model's new default waits for its rollout."""
        if model is None and self._only is not None:
            return self._only
        catalogue = self.catalogue
        try:
            version = catalogue.resolve(model, sticky)
        except LookupError as exc:
            raise UnknownModel(str(exc)) from exc
        if not catalogue.models[version.model].weights and (model is None or "@" not in model):
            return self._effective.get(version.model, version)
        return version

    def first_version(self) -> VersionKey:
        """The version a request without `model` gets now, unless weights choose."""
        return self._effective[self.catalogue.first.name]

    def serving_default(self, model: str) -> str | None:
        """The version of `model` a request without @version gets now (mid-rollout, the
        old default)."""
        version = self._effective.get(model)
        return None if version is None else version.version

    def defaults(self) -> list[VersionKey]:
        """Each model's serving default, in catalogue order."""
        return list(self._effective.values())

    def load_hint(self, version: VersionKey) -> float | None:
        """The catalogue's load time of `version` (None: none given, or not in it)."""
        model = self.catalogue.models.get(version.model)
        held = None if model is None else model.versions.get(version.version)
        return None if held is None else held.load_s

    def live(self, version: VersionKey) -> bool:
        return version in self._live

    def arrived(self, version: VersionKey, now: float) -> None:
        self._last_arrival[version] = now

    def promise(self, version: VersionKey, until: float) -> None:
        """A request for cold `version` was refused, told to come back at `until`."""
        self._promised[version] = max(self._promised.get(version, until), until)

    def last_arrival(self, version: VersionKey, now: float, coming: bool) -> float:
        """Its last arrival as placement reads it: now, while a refusal's Retry-After runs
        and the version is still cold (`coming`: resident or loading ends that)."""
        promised = self._promised.get(version)
        if promised is not None and (promised <= now or coming):
            del self._promised[version]
            promised = None
        return now if promised is not None else self._last_arrival.get(version, -math.inf)

    def wanted(self, version: VersionKey, now: float) -> bool:
        """Whether requests go to `version`: its model's serving default, a weighted
        version, the target of a rollout, or one named by a request within its model's
        idle_unload_s."""
        name, short = version.model, version.version
        model = self.catalogue.models.get(name)
        if model is None or not self.live(version):
            return False
        return (self._effective.get(name) == version or model.weights.get(short, 0) > 0
                or (name in self._rollout_since and model.default == short)
                or self._last_arrival.get(version, -math.inf) > now - model.idle_unload_s)

    # -- rollouts --------------------------------------------------------------------------
    def rolling(self) -> list[tuple[str, VersionKey, VersionKey]]:
        """(model, old, target) for each model whose new default has not taken over."""
        return [(name, self._effective[name], self.catalogue.models[name].default_key)
                for name in self._rollout_since]

    def rolled(self, model: str, now: float, new_up: int, old_up: int) -> bool:
        """Whether `model`'s new default takes over now (resident on `new_up` workers,
        the old on `old_up`): then it has."""
        since = self._rollout_since[model]
        if new_up == 0:  # a version no worker holds never becomes the default
            if now - since >= ROLLOUT_TIMEOUT_S:
                self._overdue.add(model)  # its first worker up decides, not the clock
            return False
        if new_up < old_up and now - since < ROLLOUT_TIMEOUT_S:
            return False
        old = self._effective[model]
        target = self.catalogue.models[model].default_key
        self._effective[model] = target
        del self._rollout_since[model]
        self._overdue.discard(model)
        if old != target:  # the old one's arrivals were the default's
            self._last_arrival.pop(old, None)
        self._only = self._the_only()
        return True

    def abandon(self, target: VersionKey) -> list[str]:
        """`target`'s loads keep failing: the models rolling out to it stop, their old
        default kept. The models whose rollout ended."""
        ended = [name for name, _, to in self.rolling() if to == target]
        for name in ended:
            del self._rollout_since[name]
            self._overdue.discard(name)
            self.abandoned[name] = target
        if ended:
            self._only = self._the_only()
        return ended

    def recovered(self, version: VersionKey, now: float) -> None:
        """`version` loaded after all: a rollout to it abandoned goes on."""
        name = version.model
        if self.abandoned.get(name) != version:
            return
        del self.abandoned[name]
        if self._effective.get(name) != version and \
                self.catalogue.models[name].default_key == version:
            self._rollout_since.setdefault(name, now)
            self._only = self._the_only()

    def overdue(self, model: str) -> bool:
        """Whether `model`'s rollout is past its timeout with no worker holding the target."""
        return model in self._overdue

    def next_rollout_deadline(self) -> float:
        return min((since for name, since in self._rollout_since.items()
                    if name not in self._overdue), default=math.inf) + ROLLOUT_TIMEOUT_S

    @property
    def rolling_out(self) -> bool:
        return bool(self._rollout_since)


__all__ = ["ROLLOUT_TIMEOUT_S", "Versions"]
