"""Versions whose loads keep failing: after `FAILED_LOADS` loads in a row die before their
worker comes up, a version is failing for `HOLD_S`. While it is, nothing is loaded for it
(placement, rollouts and the scaling rule leave it alone), its starts count as no capacity
coming, and a request for it with no worker up is refused at once rather than after its
deadline. Once the hold has passed one load may be tried again: a load that comes up ends the
verdict, one more death renews it at once. A version that leaves the catalogue is forgotten
(the same name added again is tried afresh).
"""

from __future__ import annotations

from batcher import VersionKey

FAILED_LOADS = 3  # loads of one version that die in a row before it is failing
HOLD_S = 300.0  # how long a failing version is left alone before one more load is tried


class Failing:
    """Synchronous, clocked by its caller."""

    def __init__(self) -> None:
        self._in_a_row: dict[VersionKey, int] = {}
        self._since: dict[VersionKey, float] = {}  # failing versions: when the verdict was given

    def load_died(self, version: VersionKey, now: float) -> bool:
        """A load of `version` died before its worker came up: whether the version turns
        failing now (it was not, or its hold had passed)."""
        died = self._in_a_row[version] = self._in_a_row.get(version, 0) + 1
        if died < FAILED_LOADS or self.failing(version, now):
            return False
        self._since[version] = now
        return True

    def loaded(self, version: VersionKey) -> None:
        """A worker came up holding `version`: its loads work."""
        self._in_a_row.pop(version, None)
        self._since.pop(version, None)

    def forget(self, version: VersionKey) -> None:
        self.loaded(version)

    def failing(self, version: VersionKey, now: float) -> bool:
        since = self._since.get(version)
        return since is not None and now < since + HOLD_S

    def until(self, version: VersionKey) -> float:
        """When `version`'s hold ends (-inf: not failing)."""
        since = self._since.get(version)
        return -float("inf") if since is None else since + HOLD_S

    def versions(self, now: float) -> list[VersionKey]:
        return [v for v in self._since if self.failing(v, now)]


__all__ = ["FAILED_LOADS", "HOLD_S", "Failing"]
