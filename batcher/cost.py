"""What a batch costs: seconds ~= fixed + per_char x characters, learned from answered batches.

The contract fixes a batch's time whatever it holds, but a real model takes longer on long
inputs, so the queue's work is counted in characters too. The line is a least-squares fit
over recent batches, kept as running sums (O(1) a batch). Long batches are rare among short
ones, and they alone show the slope: so the last `LONG_WINDOW` batches much longer than the
recent mean are kept apart, and a run of short traffic does not wash out what long input
costs. The slope counts only once the data shows it (a t-statistic of `SIGNIFICANCE`): timing
noise over a narrow spread of sizes would otherwise invent a cost. The fixed part never drops
below `floor`, the latency the contract pads every batch to.

The learned cap on characters per batch (vLLM's `max_num_batched_tokens`, from measurement)
is the size at which a batch takes `longest` seconds: no batch then holds a worker much
longer than any other. The core asks for half of what the top tier's budget leaves after
the wait for a fuller batch, so that a paid item that waits for one such batch and runs in
another is still answered in time; and never less than the fixed part plus `CHAR_SHARE` of
it, so that long inputs are not cut into batches that are mostly fixed cost. A cut also
holds at most `GROWTH` times the characters of the largest batch measured that ran within
`longest` (at least `PROBE_CHARS`): an unknown cost is found in steps, never by one batch
that holds a worker for seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW = 256  # recent batches
LONG_WINDOW = 32  # recent long batches, kept apart
LONG_FACTOR = 4.0  # a batch is long past this many times the recent mean characters
SIGNIFICANCE = 3.0  # t-statistic the slope must reach to count
PROBE_CHARS = 10_000  # a cut may always hold twice this many characters
GROWTH = 2.0  # a cut holds at most this many times the largest measured batch
CHAR_SHARE = 0.5  # a batch's characters may always cost this share of its fixed part


@dataclass(frozen=True, slots=True)
class Throughput:
    """What one worker drains at full batches of a mix of inputs: a batch of `batch_items`
    items (as many as `max_batch` and the characters' cap let in) takes `batch_s` seconds."""

    batch_items: float
    batch_s: float

    @property
    def per_worker(self) -> float:
        """Items/s one worker drains, busy all the time (inf for batches that take no
        time: a floor of 0 and nothing measured yet)."""
        return self.batch_items / self.batch_s if self.batch_s > 0 else math.inf


class _Sums:
    """Running sums of a window of (chars, seconds), exact again every `maxlen` additions."""

    __slots__ = ("adds", "c", "cc", "chars", "cs", "s", "seconds", "ss")

    def __init__(self, size: int) -> None:
        self.chars: deque[float] = deque(maxlen=size)
        self.seconds: deque[float] = deque(maxlen=size)
        self.c = self.s = self.cc = self.cs = self.ss = 0.0
        self.adds = 0

    def __len__(self) -> int:
        return len(self.chars)

    def add(self, c: float, s: float) -> None:
        if len(self.chars) == self.chars.maxlen:
            self._fold(self.chars[0], self.seconds[0], -1.0)
        self.chars.append(c)
        self.seconds.append(s)
        self._fold(c, s, 1.0)
        self.adds += 1
        if self.adds % (self.chars.maxlen or 1) == 0:  # clear the float drift
            self.c = self.s = self.cc = self.cs = self.ss = 0.0
            for c0, s0 in zip(self.chars, self.seconds, strict=True):
                self._fold(c0, s0, 1.0)

    def _fold(self, c: float, s: float, sign: float) -> None:
        self.c += sign * c
        self.s += sign * s
        self.cc += sign * c * c
        self.cs += sign * c * s
        self.ss += sign * s * s


def _largest_within(window: _Sums, seconds: float) -> float:
    """The most characters of a batch in `window` that ran within `seconds` (0: none)."""
    if not window.chars:
        return 0.0
    if max(window.seconds) <= seconds:  # the usual case, at C speed
        return max(window.chars)
    return max((c for c, t in zip(window.chars, window.seconds, strict=True) if t <= seconds),
               default=0.0)


class BatchCost:
    """The fitted line and the caps it implies: a batch of long inputs aims at `longest`
    seconds (None: its characters cost `CHAR_SHARE` of the fixed part). `max_chars` fixes
    the cap instead."""

    def __init__(self, floor: float, max_batch: int, max_chars: int | None = None,
                 longest: float | None = None) -> None:
        if floor < 0:
            raise ValueError("the latency floor must be >= 0")
        if max_chars is not None and max_chars < 1:
            raise ValueError("max_batch_chars must be at least 1")
        if longest is not None and not 0 < longest < math.inf:
            raise ValueError("the longest batch must be > 0 seconds and finite")
        self._floor = floor
        self._max_batch = max_batch
        self._fixed_cap = max_chars
        self._longest = longest
        self._recent = _Sums(WINDOW)
        self._long = _Sums(LONG_WINDOW)
        self.fixed = floor  # seconds a batch takes whatever it holds
        self.per_char = 0.0  # seconds each character adds
        self.cap: float = math.inf if max_chars is None else max_chars  # see `batch_chars`
        self._largest = 0.0

    def observe(self, seconds: float, chars: int) -> None:
        """Fold in an answered batch's model time and its characters, and refit."""
        recent = self._recent
        if len(recent) and chars > LONG_FACTOR * recent.c / len(recent):
            self._long.add(chars, seconds)
        else:
            recent.add(chars, seconds)
        self._fit()
        within = self.fixed + self._room()  # a batch that ran this long or less was fine
        self._largest = max(_largest_within(recent, within), _largest_within(self._long, within))

    def _room(self) -> float:
        """Seconds a batch's characters may add to its fixed part."""
        share = CHAR_SHARE * self.fixed
        return share if self._longest is None else max(share, self._longest - self.fixed)

    def _fit(self) -> None:
        r, g = self._recent, self._long
        n = len(r) + len(g)
        c, s = r.c + g.c, r.s + g.s
        mc, ms = c / n, s / n
        sxx = r.cc + g.cc - c * mc
        sxy = r.cs + g.cs - c * ms
        slope = 0.0
        if n > 2 and sxx > 0 and sxy > 0:
            b = sxy / sxx
            residual = max(0.0, r.ss + g.ss - s * ms - b * sxy) / (n - 2)
            if residual == 0 or b >= SIGNIFICANCE * math.sqrt(residual / sxx):
                slope = b
        self.per_char = slope
        self.fixed = max(self._floor, ms - slope * mc)
        if self._fixed_cap is None:
            self.cap = max(1.0, self._room() / slope) if slope > 0 else math.inf

    def seconds(self, chars: float) -> float:
        """Expected model time of one batch of `chars` characters."""
        return self.fixed + self.per_char * chars

    def work(self, items: float, chars: float) -> float:
        """Worker-seconds that `items` items of `chars` characters take, cut into batches as
        full as `max_batch` and the learned cap allow."""
        batches = max(items / self._max_batch, chars / self.cap)
        return batches * self.fixed + self.per_char * chars

    def throughput(self, chars_per_item: float) -> Throughput:
        """A full batch of items of `chars_per_item` characters each, by the fitted line:
        the inverse of what `work` charges an item, so that what admission counts a queue
        as and what a worker is taken to drain are one figure. Before any batch is
        measured it is `max_batch` items in `floor` seconds."""
        items = float(self._max_batch)
        if chars_per_item > 0:
            items = min(items, self.cap / chars_per_item)
        return Throughput(items, self.fixed + self.per_char * chars_per_item * items)

    def batch_chars(self) -> float:
        """Characters a batch may hold once the cost is known: the fixed cap, or the size at
        which a batch takes `longest` (inf while characters cost nothing)."""
        return self.cap

    def cut_chars(self) -> float:
        """Characters the next cut may hold: `batch_chars`, and with no fixed cap at most
        `GROWTH` times the largest batch measured that ran within `longest` (at least
        `PROBE_CHARS`)."""
        if self._fixed_cap is not None:
            return self._fixed_cap
        return min(self.cap, GROWTH * max(self._largest, PROBE_CHARS))


__all__ = ["BatchCost", "Throughput"]
