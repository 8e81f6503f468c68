"""Event simulation of capacity that follows the load: a compressed day, five pool policies on
the same seeded Poisson arrivals (paid and free apart, one input per request).

Time steps by `TICK_S`. A tick's arrivals come at its middle; at its end batches due end, starts
due come up, workers due to retire go (once idle), the door decides the tick's paid requests,
then its free ones, items past their tier's timeout leave, idle workers cut batches of at
most `MAX_BATCH` (batchgate's `FlushPolicy`, late binding; a batch takes `BATCH_S`), and the
policy is asked.
GPU-seconds count workers running or starting. The door is batchgate's `Admission`, starting
workers counted at their ETA; a refused free request's Retry-After is set against its real
wait until the door next admits free (`next`) and until free refusals stop (`calm`).

Policies: `batchgate` (`failover.fleet.Scaler`, asked every second, fed every offered
request; a down takes back the newest start, else retires a worker idle then, as the core
does); `fixed-peak` (the busiest moment at the rule's target utilization: the others' max);
`fixed-fewest` (the busiest moment at full batches: hindsight); `ray-serve-default` (no door,
one FIFO queue bounded by the clients' timeouts; Ray Serve's default policy: ceil(mean
ongoing requests, queued and in flight, over its look-back / its target), asked each control
loop, a new target after its up or down delay of the same decision (`RAY_*`, Ray Serve's
defaults), starts taken back first, a replica
retired once idle); `oracle` (each worker ceil(rate / (capacity x target_utilization)) asks
for started one start-up before it is needed, retired when not, a gap under a start-up
bridged: the floor for planning at the rule's utilization).
"""

from __future__ import annotations

import math
import random
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from api.config.tiers import DEFAULT_TIERS
from batcher import Admission, AdmissionSettings, FlushPolicy, Overloaded, RateMeter, Tier
from failover.fleet import Scaler, ScalerSettings

TICK_S, BATCH_S, START_S, MAX_BATCH = 0.001, 0.1, 120.0, FlushPolicy().max_batch
CAPACITY = MAX_BATCH / BATCH_S  # items/s one worker drains at full batches
SCALER_STEP_S = 1.0  # the core asks the rule this often (failover/models/capacity.py)
CALM_S = 1.0  # free refusals have stopped once none came for this long
# target_ongoing_requests, CONTROL_LOOP_INTERVAL_S, look_back_period_s, upscale/downscale delay
RAY_TARGET, RAY_LOOP_S, RAY_LOOK_BACK_S, RAY_UP_DELAY_S, RAY_DOWN_DELAY_S = 2, 0.1, 30, 30, 600
TIERS, BUDGET = tuple(Tier), [DEFAULT_TIERS[t].budget_ms / 1000 for t in Tier]  # paid first
DEADLINE = [DEFAULT_TIERS[t].timeout_ms / 1000 for t in Tier]
POLICIES = ("batchgate", "fixed-peak", "fixed-fewest", "ray-serve-default", "oracle")


@dataclass(frozen=True, slots=True)
class Trace:
    low: float = 200.0
    peak: float = 8_000.0
    duration_s: float = 1_200.0
    burst_at_s: float = 420.0
    burst_s: float = 30.0
    burst: float = 2.0
    paid_share: float = 0.3
    seed: int = 1

    def rate(self, t: float) -> float:
        day = (1 - math.cos(2 * math.pi * t / self.duration_s)) / 2  # the raised cosine
        burst = self.burst if self.burst_at_s <= t < self.burst_at_s + self.burst_s else 1.0
        return (self.low + (self.peak - self.low) * day) * burst


@dataclass(frozen=True, slots=True)
class Arrivals:
    trace: Trace
    counts: tuple[array[int], array[int]]  # per tier, per tick
    rates: array[float]  # the trace's rate at each tick's middle
    top: float  # the highest of them


def arrivals(trace: Trace) -> Arrivals:
    """Per-tick counts of two seeded Poisson processes: unit-rate points in the integrated
    rate, bucketed."""
    expo, ticks = random.Random(trace.seed).expovariate, round(trace.duration_s / TICK_S)
    rates = array("d", (trace.rate((k + 0.5) * TICK_S) for k in range(ticks)))
    out = []
    for share in (trace.paid_share, 1 - trace.paid_share):
        counts, acc, nxt = array("i", bytes(4 * ticks)), 0.0, expo(1.0)
        for k, r in enumerate(rates):
            acc += share * r * TICK_S
            n = 0
            while nxt < acc:
                n += 1
                nxt += expo(1.0)
            counts[k] = n
        out.append(counts)
    return Arrivals(trace, (out[0], out[1]), rates, max(rates))


@dataclass(slots=True)
class Pool:  # the workers, as the policies see and change them
    ready: int
    idle: int
    starts: deque[float] = field(default_factory=deque)  # ETAs, soonest first
    retiring: int = 0  # to retire once idle
    started: int = 0
    stopped: int = 0  # retired, or taken back while starting

    def start(self, now: float, start_s: float) -> None:
        self.starts.append(now + start_s)
        self.started += 1

    def take_back(self) -> None:  # the newest start
        self.starts.pop()
        self.stopped += 1


class Policy:
    """Sizes the pool, starting with `initial` workers; asked every `every_s` (0: never)."""

    name, initial, every_s = "", 1, 0.0
    door, fifo = True, False  # batchgate's admission; one queue, oldest first (else paid first)

    def control(self, pool: Pool, now: float, queued: int, inflight: int) -> None: ...

    def came_up(self, now: float) -> None: ...


class Fixed(Policy):
    def __init__(self, workers: int, name: str = "fixed-peak") -> None:
        self.initial, self.name = workers, name


class Batchgate(Policy):
    name, every_s = "batchgate", SCALER_STEP_S

    def __init__(self, settings: ScalerSettings, start_s: float) -> None:
        self.scaler, self.start_s, self.initial = Scaler(settings), start_s, settings.min_workers

    def control(self, pool: Pool, now: float, queued: int, inflight: int) -> None:
        d = self.scaler.decide(now, pool.ready - pool.retiring, queued, self.start_s)
        for _ in range(d.up):
            pool.start(now, self.start_s)
            self.scaler.started(now, self.start_s)
        if d.down and pool.starts:
            pool.take_back()
            self.scaler.cancel()
        elif d.down and pool.idle > pool.retiring:  # the core retires an idle worker, if any
            pool.retiring += 1

    def came_up(self, now: float) -> None:
        self.scaler.up(now)


class RayServe(Policy):
    name, every_s, door, fifo = "ray-serve-default", RAY_LOOP_S, False, True

    def __init__(self, min_workers: int, max_workers: int, start_s: float) -> None:
        self.min, self.max, self.start_s, self.counter = min_workers, max_workers, start_s, 0
        self.initial = self.target = min_workers
        self.samples: deque[int] = deque(maxlen=round(RAY_LOOK_BACK_S / RAY_LOOP_S))

    def control(self, pool: Pool, now: float, queued: int, inflight: int) -> None:
        self.samples.append(queued + inflight)
        ongoing = sum(self.samples) / len(self.samples)
        desired = min(max(math.ceil(ongoing / RAY_TARGET), self.min), self.max)
        # _apply_delay_logic: the same decision this many loops in a row, else the counter resets
        up = desired > self.target
        self.counter = 0 if desired == self.target else (
            max(self.counter, 0) + 1 if up else min(self.counter, 0) - 1)
        if abs(self.counter) > int((RAY_UP_DELAY_S if up else RAY_DOWN_DELAY_S) / RAY_LOOP_S):
            self.counter, self.target = 0, desired
        have = pool.ready - pool.retiring + len(pool.starts)
        for _ in range(self.target - have):
            pool.start(now, self.start_s)
        for _ in range(have - self.target):
            if pool.starts:
                pool.take_back()
            else:
                pool.retiring += 1  # Ray stops a replica once its requests are done


class Oracle(Policy):
    name, every_s = "oracle", TICK_S

    def __init__(self, arr: Arrivals, util: float, min_workers: int, max_workers: int,
                 start_s: float) -> None:
        need = [min(max(math.ceil(r / (CAPACITY * util) - 1e-9), min_workers), max_workers)
                for r in arr.rates]
        gap, end, prev = round(start_s / TICK_S), len(need), 0
        spans: dict[int, list[list[int]]] = {}  # per level (a worker): [opened, closed)
        for k, n in enumerate([*need, 0]):
            for level in range(prev + 1, n + 1):
                own = spans.setdefault(level, [])
                if own and k - own[-1][1] < gap:  # cheaper to keep it than to start again
                    own[-1][1] = end
                else:
                    own.append([k, end])
            for level in range(n + 1, prev + 1):
                spans[level][-1][1] = k
            prev = n
        every = [span for own in spans.values() for span in own]
        self.initial = sum(a < gap for a, _ in every)  # needed within a start-up: up at once
        self.starts = deque(sorted(a - gap for a, _ in every if a >= gap))
        self.retires = deque(sorted(b for _, b in every if b < end))
        self.start_s, self.k = start_s, 0

    def control(self, pool: Pool, now: float, queued: int, inflight: int) -> None:
        k, self.k = self.k, self.k + 1
        while self.starts and self.starts[0] <= k:
            self.starts.popleft()
            pool.start(now, self.start_s)
        while self.retires and self.retires[0] <= k:
            self.retires.popleft()
            pool.retiring += 1


@dataclass(slots=True)
class Outcome:
    policy: str
    workers: str  # the bounds, or the fixed count
    gpu_s: float = 0.0
    peak: int = 0  # most workers held (running or starting)
    started: int = 0
    stopped: int = 0  # retired, or taken back while starting
    refused: list[int] = field(default_factory=lambda: [0, 0])  # per tier
    dropped: list[int] = field(default_factory=lambda: [0, 0])  # at their deadline
    latency: list[list[int]] = field(default_factory=list)  # per tier: ticks -> items
    # refused free: (tick refused, Retry-After, real wait, refusals), per way of measuring
    waits: dict[str, list[tuple[int, float, float, int]]] = field(
        default_factory=lambda: {"next": [], "calm": []})

    def percentile(self, tier: Tier, q: float) -> float:  # seconds from the arrival tick's middle
        goal, seen = q * sum(self.latency[tier]), 0
        for h, n in enumerate(self.latency[tier]):
            seen += n
            if n and seen >= goal:
                return (h - 0.5) * TICK_S
        return math.nan

    def over(self, tier: Tier) -> int:  # answered past the budget, refused, or dropped
        first = math.floor(BUDGET[tier] / TICK_S + 0.5) + 1
        return sum(self.latency[tier][first:]) + self.refused[tier] + self.dropped[tier]

    def retry_fit(self, kind: str, within: float = 0.2,
                  when: Callable[[float], bool] = lambda t: True) -> tuple[float, float, int]:
        """(share of free refusals whose Retry-After is within `within` of their real wait,
        the median Retry-After / real wait, refusals), of those refused at a time `when`
        holds for."""
        rows = sorted((r / w, n, abs(r - w) <= within * w) for k, r, w, n in self.waits[kind]
                      if when(k * TICK_S))
        total, seen = sum(n for _, n, _ in rows), 0
        for ratio, n, _ in rows:
            seen += n
            if seen * 2 >= total:
                return sum(n for _, n, ok in rows if ok) / total, ratio, total
        return math.nan, math.nan, 0


class _Run:
    def __init__(self, arr: Arrivals, policy: Policy, workers: str) -> None:
        self.arr, self.policy, self.last, self.last_refusal = arr, policy, len(arr.rates), 0
        self.out, self.pool = Outcome(policy.name, workers), Pool(policy.initial, policy.initial)
        self.adm = Admission(AdmissionSettings(budgets=dict(zip(Tier, BUDGET, strict=True))))
        flush, self.batch = FlushPolicy(), round(BATCH_S / TICK_S)
        self.wait, self.spare = round(flush.max_wait / TICK_S), flush.spare
        self.ring_w, self.ring_i = [0] * (2 * self.batch), [0] * (2 * self.batch)
        self.out.latency = self.hist = [[0] * round((max(DEADLINE) + 2 * BATCH_S) / TICK_S)
                                        for _ in Tier]
        self.queues: list[deque[list[int]]] = [deque(), deque()]  # [arrival tick, count]
        self.queued, self.inflight, self.meters = [0, 0], 0, [RateMeter(), RateMeter()]
        self.offered = [RateMeter(), RateMeter()]  # admitted or refused, as the core meters
        self.pending: dict[str, list[tuple[int, float, int]]] = {"next": [], "calm": []}

    def run(self) -> Outcome:
        pool, policy, out, queues, queued = (self.pool, self.policy, self.out, self.queues,
                                             self.queued)
        scaler: Scaler | None = getattr(policy, "scaler", None)
        every = round(policy.every_s / TICK_S) if policy.every_s else 0
        dl, calm, gpu, k = [round(d / TICK_S) for d in DEADLINE], round(CALM_S / TICK_S), 0, -1
        while True:  # past `last`: no arrivals, no cost, what is queued is answered
            k += 1
            if k >= self.last and not queued[0] + queued[1]:
                break
            now = (k + 1) * TICK_S
            self._workers(now)
            n = [self.arr.counts[0][k], self.arr.counts[1][k]] if k < self.last else [0, 0]
            for t in TIERS:
                if n[t]:
                    self.offered[t].add(n[t], now)
                if scaler is not None and n[t]:
                    scaler.arrived(n[t], now, t == Tier.PAID)
            if policy.door and n[0] + n[1]:
                self._door(k, now, n)
            if self.pending["calm"] and k - self.last_refusal >= calm:
                self._resolve("calm", self.last_refusal + 1)
            for t in TIERS:
                q = queues[t]
                if n[t]:
                    self.meters[t].add(n[t], now)
                    q.append([k, n[t]])
                    queued[t] += n[t]
                while q and q[0][0] <= k - dl[t]:
                    queued[t] -= q[0][1]
                    out.dropped[t] += q.popleft()[1]
            if pool.idle and queued[0] + queued[1]:
                self._cut(k, now)
            if k >= self.last:
                continue
            if every and k % every == 0:
                policy.control(pool, now, queued[0] + queued[1], self.inflight)
            held = pool.ready + len(pool.starts)
            gpu, out.peak = gpu + held, max(out.peak, held)
        out.gpu_s, out.started, out.stopped = gpu * TICK_S, pool.started, pool.stopped
        return out

    def _workers(self, now: float) -> None:
        pool, slot = self.pool, round(now / TICK_S - 1) % len(self.ring_w)
        if self.ring_w[slot]:
            pool.idle += self.ring_w[slot]
            self.inflight -= self.ring_i[slot]
            self.ring_w[slot] = self.ring_i[slot] = 0
        while pool.starts and pool.starts[0] <= now + 1e-9:
            pool.starts.popleft()
            pool.ready, pool.idle = pool.ready + 1, pool.idle + 1
            self.policy.came_up(now)
        if n := min(pool.retiring, pool.idle):
            pool.retiring, pool.idle, pool.ready, pool.stopped = (
                pool.retiring - n, pool.idle - n, pool.ready - n, pool.stopped + n)

    def _door(self, k: int, now: float, n: list[int]) -> None:
        """Cuts the tick's arrivals `n` to what the door admits."""
        adm, ready, ahead = self.adm, self.pool.ready, 0
        joining = tuple(e - now for e in self.pool.starts)
        # a worker up past every budget changes no admission (the same answers, faster)
        near = joining if joining and (joining[0] < max(BUDGET) or not ready) else ()
        for t in TIERS:
            ahead += self.queued[t]
            over = (self.meters[0].rate(now) + n[Tier.PAID] / self.meters[0].tau  # and this tick's
                    if t == Tier.FREE else 0.0)  # paid overtakes free
            if n[t] and not adm.admits(t, ahead + n[t] - 1, ready, DEADLINE[t], over,
                                       joining=near):
                m = _most(adm, t, ahead, n[t], ready, over, near)
                self.out.refused[t] += n[t] - m
                if t == Tier.FREE:
                    try:
                        adm.check(t, ahead + m, ready, DEADLINE[t], over, joining=joining,
                                  offered=self.offered[0].rate(now) + self.offered[1].rate(now))
                        raise RuntimeError("the door admitted what it just refused")
                    except Overloaded as exc:
                        retry = exc.retry_after
                    if m:
                        self._resolve("next", k)
                    for kind in self.pending:
                        self.pending[kind].append((k, retry, n[t] - m))
                    self.last_refusal = k
                n[t] = m
            elif n[t] and t == Tier.FREE and self.pending["next"]:
                self._resolve("next", k)
            ahead += n[t]

    def _resolve(self, kind: str, at: int) -> None:  # what is pending waited until `at`
        self.out.waits[kind].extend((k, r, (at - k) * TICK_S, c) for k, r, c in self.pending[kind])
        self.pending[kind].clear()

    def _cut(self, k: int, now: float) -> None:
        """Batches for idle workers while the flush policy says so: paid first, or the oldest
        first (`fifo`)."""
        pool, queues, queued, hist = self.pool, self.queues, self.queued, self.hist
        paid, free, done = *queues, k + 1 + self.batch
        while pool.idle and queued[0] + queued[1]:
            if queued[0] + queued[1] < MAX_BATCH and k - min(
                    paid[0][0] if paid else k, free[0][0] if free else k) < self.wait and (
                    pool.idle < 2 or pool.ready - pool.idle + 1 + self.spare * (
                        (self.meters[0].rate(now) + self.meters[1].rate(now)) / CAPACITY)
                    > pool.ready):
                break  # not full, not due, and no spare workers for the idle trigger
            room = MAX_BATCH
            while room and queued[0] + queued[1]:
                t = Tier.FREE if not paid or (self.policy.fifo and free and free[0][0]
                                              < paid[0][0]) else Tier.PAID
                head = queues[t][0]
                c = min(room, head[1])
                hist[t][done - head[0]] += c
                room, queued[t] = room - c, queued[t] - c
                if c == head[1]:
                    queues[t].popleft()
                else:
                    head[1] -= c
            pool.idle -= 1
            self.ring_w[(k + self.batch) % len(self.ring_w)] += 1
            self.ring_i[(k + self.batch) % len(self.ring_i)] += MAX_BATCH - room
            self.inflight += MAX_BATCH - room


def _most(adm: Admission, tier: Tier, queued: int, n: int, ready: int, over: float,
          joining: tuple[float, ...]) -> int:
    """How many of `n` requests arriving one by one are admitted (monotone in the queue)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if adm.admits(tier, queued + mid - 1, ready, DEADLINE[tier], over, joining=joining):
            lo = mid
        else:
            hi = mid - 1
    return lo


def simulate(arr: Arrivals, policy: Policy, workers: str = "") -> Outcome:
    return _Run(arr, policy, workers).run()


def run_all(arr: Arrivals, min_workers: int = 1, start_s: float = START_S,
            settings: ScalerSettings | None = None, names: Sequence[str] = POLICIES,
            jobs: int = 1) -> list[Outcome]:
    """Each policy over the same arrivals, `jobs` at a time; the scaling ones between
    `min_workers` and the pool the busiest moment needs at the rule's target utilization
    (the rule within `settings`' bounds, when given)."""
    one = partial(_run_one, arr, min_workers, start_s, settings)
    if jobs < 2:
        return list(map(one, names))
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(one, names))


def _run_one(arr: Arrivals, min_workers: int, start_s: float,
             settings: ScalerSettings | None, name: str) -> Outcome:
    util = (settings or ScalerSettings(1, 1)).target_utilization
    top = math.ceil(arr.top / (CAPACITY * util) - 1e-9)
    rule, bounds = settings or ScalerSettings(min_workers, top), f"{min_workers}:{top}"
    fewest = math.ceil(arr.top / CAPACITY - 1e-9)  # the busiest moment at full batches
    make: dict[str, Callable[[], tuple[Policy, str]]] = {
        "batchgate": lambda: (Batchgate(rule, start_s), f"{rule.min_workers}:{rule.max_workers}"),
        "fixed-peak": lambda: (Fixed(top), str(top)),
        "fixed-fewest": lambda: (Fixed(fewest, "fixed-fewest"), str(fewest)),
        "ray-serve-default": lambda: (RayServe(min_workers, top, start_s), bounds),
        "oracle": lambda: (Oracle(arr, util, min_workers, top, start_s), bounds),
    }
    return simulate(arr, *make[name]())


__all__ = ["POLICIES", "Arrivals", "Outcome", "Policy", "Pool", "Trace", "arrivals", "run_all",
           "simulate"]
