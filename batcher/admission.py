"""Admission control: refuse at the door what the queue cannot serve in time.

For an arriving request, the expected completion is estimated from the work queued ahead of
it (its own tier and every tier above, retry lane included) and its own, in worker-seconds
from the learned batch cost (`batcher/cost.py`: a fixed part per batch plus a part per
character, so 100 long inputs weigh what they cost, not what 100 short ones do), over the
ready workers less what higher tiers keep arriving with (they will overtake it while it
waits), plus the run of its own last batch. A request whose own inputs, with the pool to
itself, cannot be answered before its deadline is refused first (`deadline_unreachable`):
it would hold workers for an answer nobody waits for. Over the tier's budget, the request
is refused at once, with a Retry-After from the time the queue needs to drain. Free traffic
has the smaller budget, so it is shed first; paid traffic is refused only when the paid
queue alone cannot be served in time. This is throttling tied to the observed queue, not a
static token bucket.

While the pool grows, workers on their way count from the moment each is expected up
(`joining`): the work ahead drains over that capacity curve (`capacity_wait`). A refusal's
Retry-After is the time until a request of its tier would fit its budget on that curve: the
capacity it needs being up, or the queue ahead drained, whichever comes first.

The same cost line says what one worker drains (`throughput`): full batches of the mix of
characters per item that recent batches carried. It is the one measured capacity of the
version this admission serves; placement and the scaling rule read it from its core.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from batcher.cost import BatchCost, Throughput
from batcher.errors import DeadlineUnreachable, NoWorkerReady, OverBudget
from batcher.types import MAX_BATCH, Tier


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    budgets: dict[Tier, float]  # seconds of expected completion time, per tier
    max_batch: int = MAX_BATCH
    initial_latency: float = 0.1  # batch latency assumed until one is measured
    smoothing: float = 0.2  # weight of the newest batch in the latency and mix averages
    max_batch_chars: int | None = None  # a fixed cap on a batch's characters (None: learned)
    longest_batch: float | None = None  # seconds the learned cap aims at (see `BatchCost`)

    def __post_init__(self) -> None:
        if set(self.budgets) != set(Tier):
            raise ValueError("an admission budget is needed for every tier")
        if any(b <= 0 for b in self.budgets.values()):
            raise ValueError("admission budgets must be > 0 seconds")
        if not 0 < self.smoothing <= 1:
            raise ValueError("smoothing must be within (0, 1]")


MIN_SHARE = 0.05  # a tier is never assumed to get less than this share of the pool


def capacity_wait(
    work: float, workers: float, joining: Sequence[float] = (), used: float = 0.0
) -> float:
    """Seconds until `work` worker-seconds are done by `workers` now and one more from each
    of `joining` (seconds from now, sorted), less the `used` workers that tiers served first
    take (never below `MIN_SHARE` of the pool); math.inf when no capacity ever comes. No work
    still waits for a worker to be there."""
    if work <= 0:
        return 0.0 if workers > 0 else joining[0] if joining else math.inf
    t, done = 0.0, 0.0
    for at in (*joining, math.inf):
        left = max(workers - used, MIN_SHARE * workers) if workers > 0 else 0.0
        if left > 0:
            end = t + (work - done) / left
            if end <= at:
                return end
            done += left * (at - t)
        t, workers = max(t, at), workers + 1
    return math.inf


class RateMeter:
    """Arrivals per second, and their characters per second, decaying exponentially with
    time constant `tau` seconds."""

    __slots__ = ("_chars", "_last", "_rate", "tau")

    def __init__(self, tau: float = 1.0) -> None:
        self.tau = tau
        self._rate = 0.0
        self._chars = 0.0
        self._last = -math.inf

    def add(self, n: int, now: float, chars: int = 0) -> None:
        if now == self._last:  # the same instant (a gateway's frame): nothing decayed
            self._rate += n / self.tau
            self._chars += chars / self.tau
            return
        decay = math.exp(-(now - self._last) / self.tau)  # 0 before the first arrival
        self._rate = self._rate * decay + n / self.tau
        self._chars = self._chars * decay + chars / self.tau
        self._last = now

    def rate(self, now: float) -> float:
        if self._last == -math.inf:
            return 0.0
        return self._rate * math.exp(-(now - self._last) / self.tau)

    def rates(self, now: float) -> tuple[float, float]:
        """(items/s, characters/s)."""
        if self._last == -math.inf:
            return 0.0, 0.0
        decay = math.exp(-(now - self._last) / self.tau)
        return self._rate * decay, self._chars * decay


class Admission:
    def __init__(self, settings: AdmissionSettings) -> None:
        self._settings = settings
        self._latency = settings.initial_latency
        self.cost = BatchCost(settings.initial_latency, settings.max_batch,
                              settings.max_batch_chars, settings.longest_batch)
        self._per_item = 1 / settings.max_batch
        self._chars_per_item: float | None = None  # of answered batches (an EWMA)

    @property
    def batch_latency(self) -> float:
        return self._latency

    def observe_batch(self, seconds: float, chars: int = 0, items: int = 0) -> None:
        """Fold a measured batch into the latency average (an EWMA) and the cost line, and
        its `items` (0: not told) into the mix of characters per item."""
        a = self._settings.smoothing
        self._latency = (1 - a) * self._latency + a * seconds
        self.cost.observe(seconds, chars)
        if items > 0:
            mix = chars / items
            last = self._chars_per_item
            self._chars_per_item = mix if last is None else (1 - a) * last + a * mix

    def throughput(self) -> Throughput:
        """What one worker drains at full batches of the current mix (the characters per
        item of recent batches), by the cost line that admission counts the queue with.
        Before any batch is measured it is what admission assumes: `max_batch` items in
        `initial_latency` seconds (the version's batch latency floor or hint)."""
        return self.cost.throughput(self._chars_per_item or 0.0)

    def estimate(
        self, queued: int, workers: int, overtaking: float = 0.0, *, queued_chars: int = 0,
        items: int = 1, chars: int = 0, overtaking_chars: float = 0.0,
        joining: Sequence[float] = (),
    ) -> float:
        """Expected seconds until the last item of a request of `items` items (`chars`
        characters) is answered, with `queued` items (`queued_chars` characters) served
        before it, while higher tiers arrive at `overtaking` items/s (`overtaking_chars`
        characters/s): they are served first. `joining`: seconds from now at which each
        worker on its way is expected up (sorted)."""
        return self._times(queued, workers, overtaking, queued_chars, items, chars,
                           overtaking_chars, joining)[1]

    def _times(
        self, queued: int, workers: int, overtaking: float, queued_chars: int, items: int,
        chars: int, overtaking_chars: float, joining: Sequence[float] = (),
    ) -> tuple[float, float]:
        """(alone, expected): the request's own work with the pool to itself, and with the
        queue ahead and the overtaking tiers. Its last batch holds at most the cap's
        characters (one input runs alone whatever its size); the rest is work ahead."""
        if joining:
            return self._times_joining(queued, workers, overtaking, queued_chars, items,
                                       chars, overtaking_chars, joining)[:2]
        if workers <= 0:
            return math.inf, math.inf
        cost = self.cost
        cap, fixed, per_char, per_item = cost.cap, cost.fixed, cost.per_char, self._per_item
        if items <= 1:  # the common case, kept cheap: the door admits thousands a second
            last, own = chars, 0.0
        else:
            last = chars if chars <= cap else int(cap)
            own = cost.work(items - 1, chars - last)
        run = fixed + per_char * last
        ahead = own
        if queued > 0:  # `cost.work`, inline
            ahead += max(queued * per_item, queued_chars / cap) * fixed + per_char * queued_chars
        left: float = workers
        if overtaking > 0:
            used = cost.work(overtaking, overtaking_chars)
            left = max(workers - used, MIN_SHARE * workers)
        return own / workers + run, ahead / left + run

    def _times_joining(
        self, queued: int, workers: int, overtaking: float, queued_chars: int, items: int,
        chars: int, overtaking_chars: float, joining: Sequence[float],
    ) -> tuple[float, float, float]:
        """`_times` while workers are on their way, and the time the queue ahead needs to
        drain on that capacity curve (alone, expected, drained)."""
        cost = self.cost
        last = chars if items <= 1 or chars <= cost.cap else int(cost.cap)
        own = cost.work(items - 1, chars - last) if items > 1 else 0.0
        run = cost.fixed + cost.per_char * last
        ahead = cost.work(queued, queued_chars) if queued > 0 else 0.0
        used = cost.work(overtaking, overtaking_chars) if overtaking > 0 else 0.0
        return (capacity_wait(own, workers, joining) + run,
                capacity_wait(ahead + own, workers, joining, used) + run,
                capacity_wait(ahead, workers, joining, used))

    def _covered(self, offered: float, workers: int, joining: Sequence[float]) -> float:
        """Seconds until the ready workers and those on their way run `offered` items/s
        (0: they do now; the last on its way if even all of them fall short): before
        then, the queue ahead only refills as fast as it drains."""
        need = self.cost.work(offered, 0.0)  # workers busy all the time
        if need <= workers:
            return 0.0
        short = math.ceil(need - workers - 1e-9)
        return joining[min(short, len(joining)) - 1]

    def budget(self, tier: Tier) -> float:
        return self._settings.budgets[tier]

    def admits(
        self, tier: Tier, queued: int, workers: int, deadline_in: float,
        overtaking: float = 0.0, queued_chars: int = 0, items: int = 1, chars: int = 0,
        overtaking_chars: float = 0.0, joining: Sequence[float] = (),
    ) -> bool:
        """Whether a request is admitted (see `estimate` for the arguments); counts no
        refusal."""
        if workers <= 0 and not joining:
            return False
        if workers > 0 and queued <= 0 and items <= 1 and chars <= self.cost.cap:
            return True  # one plain batch and nothing ahead: refusing it protects nobody
        alone, expected = self._times(queued, workers, overtaking, queued_chars, items, chars,
                                      overtaking_chars, joining)
        return max(alone, expected) <= deadline_in and expected <= self._settings.budgets[tier]

    def judge(
        self, queued: int, workers: int, deadline_in: float, overtaking: float = 0.0,
        queued_chars: int = 0, items: int = 1, chars: int = 0, overtaking_chars: float = 0.0,
        joining: Sequence[float] = (),
    ) -> None:
        """A streamed request's judgement before it starts (see `estimate` for the
        arguments): its inputs are fed through a window and each answered as it lands, so
        its deadline bounds it, not its tier's budget (which bounds one answer's wait).
        Raises `NoWorkerReady`, or `DeadlineUnreachable` when its last input is not
        expected back before the deadline."""
        if workers <= 0 and not joining:
            raise NoWorkerReady("no worker is ready", 1.0)
        alone, expected = self._times(queued, workers, overtaking, queued_chars, items, chars,
                                      overtaking_chars, joining)
        if max(alone, expected) > deadline_in:
            raise DeadlineUnreachable(
                f"its {items} inputs need about {max(alone, expected) * 1000:.0f} ms with the "
                f"work queued ahead, past the request's deadline of {deadline_in * 1000:.0f} "
                f"ms: send fewer inputs, or a longer X-Request-Timeout-Ms",
                max(0.0, expected - alone))

    def check(
        self, tier: Tier, queued: int, workers: int, deadline_in: float,
        overtaking: float = 0.0, queued_chars: int = 0, items: int = 1, chars: int = 0,
        overtaking_chars: float = 0.0, joining: Sequence[float] = (), offered: float = 0.0,
    ) -> None:
        """Admit, or raise the `Overloaded` of the limit hit (with a Retry-After: the time
        until a request like it would fit its tier's budget). `offered`: items/s this tier
        and those above offer, admitted or refused: while more than the ready workers run,
        the Retry-After is when the workers on their way cover it."""
        if self.admits(tier, queued, workers, deadline_in, overtaking, queued_chars, items,
                       chars, overtaking_chars, joining):
            return
        if workers <= 0 and not joining:
            raise NoWorkerReady("no worker is ready", 1.0)
        budget = self._settings.budgets[tier]
        if joining:
            alone, expected, drained = self._times_joining(
                queued, workers, overtaking, queued_chars, items, chars, overtaking_chars,
                joining)
        else:
            alone, expected = self._times(queued, workers, overtaking, queued_chars, items,
                                          chars, overtaking_chars)
            drained = max(0.0, expected - alone)  # the time the queue ahead needs to drain
        # While the queue ahead lasts, a request's expected completion stays where it is now
        # (what drains is ahead of it): it fits once that is within the budget, and anyway
        # once the queue is gone.
        retry = min(max(0.0, expected - budget), drained)
        if joining and offered > 0:
            retry = max(retry, self._covered(offered, workers, joining))
        if alone > deadline_in:  # decided here, before any of it holds a worker
            raise DeadlineUnreachable(
                f"its inputs alone need about {alone * 1000:.0f} ms, past the request's "
                f"deadline of {deadline_in * 1000:.0f} ms: send fewer or shorter inputs",
                drained,
            )
        if expected > budget:
            raise OverBudget(
                f"expected wait {expected * 1000:.0f} ms exceeds the {tier.label} "
                f"tier's budget of {budget * 1000:.0f} ms",
                retry,
            )
        raise DeadlineUnreachable(
            f"expected wait {expected * 1000:.0f} ms exceeds the request's deadline",
            max(0.0, min(expected - deadline_in, drained)),
        )


__all__ = ["Admission", "AdmissionSettings", "RateMeter", "capacity_wait"]
