"""Which version's core a request's items go to, when several serve: the items of one
version go to its core; a version with no worker up counts the workers loading it as ready,
so that its requests are queued, not refused; a cold version whose load the request's
deadline cannot wait for refuses it (`ModelLoading`, with the load's ETA as its
Retry-After), and until then the refusal asks placement for the load, as an arrival would; a
version with no worker up whose loads keep failing refuses it at once (`ModelFailing`, with
the end of the hold as its Retry-After); a cold version that no placement can ever give a
worker on this pool (`failover.fleet.fitting`) refuses it at once (`ModelUnplaceable`, no
load promised).
"""

from __future__ import annotations

from collections.abc import Sequence

from batcher import BatchgateError, Item, VersionKey
from failover import (
    DispatchCore,
    ModelFailing,
    ModelLoading,
    ModelUnplaceable,
    Refusal,
    UnknownModel,
)
from failover.fleet.catalogue import Catalogue
from failover.fleet.failing import Failing
from failover.fleet.fitting import unreachable
from failover.fleet.placing import Placing
from failover.fleet.residency import Residency
from failover.fleet.versions import Versions


class Routing:
    def __init__(self, versions: Versions, residency: Residency, placing: Placing,
                 cores: dict[VersionKey, DispatchCore], failing: Failing,
                 most: int | None = None) -> None:
        """`cores`: the composite's, by version, and `failing` (both read only); `most`:
        the pool's largest size (None: not known, nothing is refused as unplaceable)."""
        self._most = most
        self._lost: tuple[Catalogue | None, dict[VersionKey, str]] = (None, {})
        self._versions = versions
        self._failing = failing
        self._residency = residency
        self._placing = placing
        self._cores = cores

    def admit(self, items: list[Item], deadline_in: float, now: float, draining: bool
              ) -> bool:
        core, arriving = self.core_for(items, deadline_in, now, draining)
        return core.admit(items, deadline_in, now, arriving) or arriving > 0

    def admit_all(self, requests: Sequence[tuple[list[Item], float]], now: float,
                  draining: bool) -> tuple[list[Refusal | None], bool]:
        """Each version's requests admitted by its core at once."""
        refusals: list[Refusal | None] = [None] * len(requests)
        by_version: dict[VersionKey, list[int]] = {}
        for at, (items, _) in enumerate(requests):
            version = items[0].version or self._versions.first_version()
            by_version.setdefault(version, []).append(at)
        turn = False
        for where in by_version.values():
            first = requests[where[0]]
            try:
                core, arriving = self.core_for(first[0], first[1], now, draining)
            except BatchgateError as exc:
                for at in where:
                    refusals[at] = exc
                turn = turn or isinstance(exc, ModelLoading)  # placement may start a load
                continue
            said, must = core.admit_all([requests[at] for at in where], now, arriving)
            for at, refusal in zip(where, said, strict=True):
                refusals[at] = refusal
            turn = turn or must or arriving > 0
        return refusals, turn

    def core_for(self, items: list[Item], deadline_in: float, now: float, draining: bool
                 ) -> tuple[DispatchCore, int]:
        """The core of the items' version and its workers on their way while it has none
        up, or the refusal: not served, or cold past the request's deadline."""
        versions = self._versions
        version = items[0].version or versions.first_version()  # None: the first model's
        core = self._cores.get(version)
        if core is None or not versions.live(version):
            raise UnknownModel(f"model version {version!r} is not served")
        versions.arrived(version, now)
        if core.ready_count() or draining:
            return core, 0
        if self._failing.failing(version, now):
            wait = self._failing.until(version) - now
            raise ModelFailing(f"{version}'s loads keep failing: none is tried for "
                               f"{wait:.0f} s, or until the catalogue changes it",
                               retry_after=wait)
        why = self._unplaceable(version)
        if why is not None and not self._residency.loading(version):
            raise ModelUnplaceable(f"{version} can never get a worker on this pool: {why}")
        eta = self._placing.eta(version, now)
        if eta > deadline_in:  # until then the refusal asks for the load, as an arrival
            versions.promise(version, now + eta)
            raise ModelLoading(
                f"{version} is loading (about {eta:.1f} s), past the request's deadline",
                retry_after=eta)
        return core, max(1, self._residency.loading(version))

    def _unplaceable(self, version: VersionKey) -> str | None:
        """Why no placement can give `version` a worker (None: one can), worked out once
        per catalogue."""
        if self._most is None:
            return None
        catalogue = self._versions.catalogue
        if self._lost[0] is not catalogue:
            self._lost = (catalogue, unreachable(catalogue, self._most))
        return self._lost[1].get(version)


__all__ = ["Routing"]
