"""Callers whose inputs keep killing workers, refused for a while.

Quarantine works by exact text, so a caller sending a fresh crashing input each time would
spend the pool's restarts for ever. Each input convicted as a query of death is charged to
its caller (an account; anonymous callers are one); a caller convicted `strikes` times
within `window` seconds is refused for `block` seconds. Bounded and expiring, like the
quarantine; time is passed in.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OffenderSettings:
    strikes: int = 2  # convictions within the window that get a caller refused
    window: float = 600.0
    block: float = 300.0  # seconds a caller is refused for
    max_callers: int = 10_000

    def __post_init__(self) -> None:
        if self.strikes < 1 or min(self.window, self.block) <= 0 or self.max_callers < 1:
            raise ValueError(f"offender settings out of range: {self}")


class Offenders:
    def __init__(self, settings: OffenderSettings | None = None) -> None:
        self.settings = settings or OffenderSettings()
        self._strikes: OrderedDict[str, deque[float]] = OrderedDict()
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def convicted(self, caller: str | None, now: float) -> None:
        """One of `caller`'s inputs was convicted as a query of death at `now`."""
        if caller is None:
            return
        s = self.settings
        times = self._strikes.pop(caller, None) or deque()
        times.append(now)
        while times and times[0] <= now - s.window:
            times.popleft()
        self._strikes[caller] = times
        while len(self._strikes) > s.max_callers:
            self._strikes.popitem(last=False)
        if len(times) >= s.strikes:
            self._until[caller] = now + s.block
            times.clear()

    def refused_for(self, caller: str | None, now: float) -> float:
        """Seconds `caller` is still refused for (0: not refused). Cheap while no one is."""
        until = self._until.get(caller) if caller is not None else None
        if until is None:
            return 0.0
        if until <= now:
            del self._until[caller]  # type: ignore[arg-type]
            return 0.0
        return until - now


__all__ = ["OffenderSettings", "Offenders"]
