"""Watching a server while a load runs on it: the pool sampled (`/admin/workers`, the
capacity ETA, the queues), free requests sent one by one and watched (status, Retry-After),
and what was seen, read back against the server's own metrics. The scaling benchmarks
(`loadtest.scale_step`, `loadtest.scale_outage`) and their tests stand on it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from loadtest.probe import ProbeConfig, run_probe
from loadtest.probe_results import ProbeResult
from loadtest.server import fetch_metrics, metric, parse_metrics

# The example keys' names (so the tests' helpers read /admin/workers as usual).
PAID_KEY, FREE_KEY, ADMIN_KEY = "paid-demo-key", "free-demo-key", "admin-demo-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PAID_BUDGET_S, FREE_BUDGET_S = 0.4, 0.25  # the benchmarks' keys files set them


@dataclass(frozen=True, slots=True)
class Sample:
    """/admin/workers and the capacity ETA at `at` (monotonic seconds)."""

    at: float
    desired: int
    starting: int
    running: int
    states: tuple[str, ...]  # each worker's
    eta_s: float  # batchgate_capacity_eta_seconds: until the next start is expected up
    queued: tuple[int, int]  # items in the paid and the free queues


@dataclass(frozen=True, slots=True)
class Watched:
    """One watched request: when it was sent and answered (monotonic seconds), its status
    (0: no answer), its error code (or why there was no answer), its Retry-After, and
    whether a 200 was its own output."""

    sent: float
    answered: float
    status: int
    code: str
    retry_after: float | None
    right: bool


async def sample_pool(url: str, every: float, until: float, out: list[Sample],
                      done: anyio.Event) -> None:
    """Poll /admin/workers and /metrics (another process) every `every` s, until `done`."""
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=5) as client:
        while not done.is_set() and time.monotonic() < until:
            try:
                body = (await client.get("/admin/workers")).json()
                m = parse_metrics((await client.get("/metrics")).text)
            except (httpx.HTTPError, ValueError):
                body = None  # a sample missed under load; the next one counts
            if body is not None:
                ws = body["workers"]
                out.append(Sample(
                    time.monotonic(), int(body["desired"]), int(body["starting"]),
                    int(body["running"]), tuple(str(w["state"]) for w in ws),
                    metric(m, "batchgate_capacity_eta_seconds"),
                    (round(metric(m, "batchgate_queue_depth", tier="paid")),
                     round(metric(m, "batchgate_queue_depth", tier="free")))))
            with anyio.move_on_after(every):
                await done.wait()


async def watch(url: str, rps: float, until: float, timeout_s: float, out: list[Watched],
                stop: anyio.Event) -> None:
    """Send a free request every 1/`rps` s until `stop` or `until`, each on its own (open
    loop: a slow answer delays no other), and keep what came back."""
    tag = os.urandom(4).hex()
    # A connection idle as long as the server keeps one (5 s) may be closed as a request
    # goes out on it: let them go sooner, as the probe does.
    limits = httpx.Limits(max_connections=max(8, math.ceil(rps * timeout_s)),
                          keepalive_expiry=2.0)
    headers = {"Authorization": f"Bearer {FREE_KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits,
                                 headers=headers) as client:

        async def one(n: int) -> None:
            text, sent = f"w{n}-{tag}", time.monotonic()
            try:
                r = await client.post("/v1/batchstring", json={"input": text})
            except httpx.HTTPError as exc:  # no answer: its kind is kept as the code
                out.append(Watched(sent, time.monotonic(), 0, type(exc).__name__, None, False))
                return
            body, ra = r.json(), r.headers.get("retry-after")
            code = "" if r.status_code == 200 else str(body.get("error", {}).get("code"))
            out.append(Watched(sent, time.monotonic(), r.status_code, code,
                               None if ra is None else float(ra),
                               r.status_code == 200 and body.get("output") == text[::-1]))

        async with anyio.create_task_group() as tg:
            start, n = time.monotonic(), 0
            while (at := start + n / rps) < until and not stop.is_set():
                await anyio.sleep(max(0.0, at - time.monotonic()))
                tg.start_soon(one, n)
                n += 1


# -- what the samples and watched answers say -------------------------------------------------
def first_at(samples: Sequence[Sample], holds: Callable[[Sample], bool],
             after: float = -math.inf) -> float | None:
    """When the first sample at or after `after` for which `holds` was taken."""
    return next((s.at for s in samples if s.at >= after and holds(s)), None)


def up_at(samples: Sequence[Sample], n: int, after: float = -math.inf) -> float | None:
    """The first sample at or after `after` with `n` workers running."""
    return first_at(samples, lambda s: s.running >= n, after)


@dataclass(frozen=True, slots=True)
class RetryFit:
    """A refusal's Retry-After against the time the capacity that ended refusals came."""

    refused: float  # its answer came then (Retry-After counts from the answer)
    retry_after: float
    came: float

    @property
    def wait(self) -> float:
        return self.came - self.refused

    @property
    def error(self) -> float:
        """Seconds the retry it asks for lands after the capacity came (< 0: before)."""
        return self.refused + self.retry_after - self.came

    def within(self, share: float, slack: float) -> bool:
        return abs(self.error) <= share * abs(self.wait) + slack


@dataclass(frozen=True, slots=True)
class Refusals:
    """The watched free refusals (503) sent between two times, and what ended them."""

    refused: tuple[Watched, ...]
    last: float | None  # the last refusal was sent then
    count: int | None  # the fewest workers running from whose arrival on none was refused
    came: float | None  # when that many were first running
    fits: tuple[RetryFit, ...]


def refusals(watched: Sequence[Watched], samples: Sequence[Sample], since: float,
             until: float, settle_s: float) -> Refusals:
    """`settle_s`: how long after the capacity came a refusal may still be sent (the queue
    admitted before it drains; the sample shows it late)."""
    refused = tuple(w for w in watched if since <= w.sent < until and w.status == 503)
    if not refused:
        return Refusals((), None, None, None, ())
    last = max(w.sent for w in refused)
    for count in range(1, max((s.running for s in samples), default=0) + 1):
        came = up_at(samples, count, since)
        if came is not None and last <= came + settle_s:
            fits = tuple(RetryFit(w.answered, w.retry_after, came) for w in refused
                         if w.retry_after is not None)
            return Refusals(refused, last, count, came, fits)
    return Refusals(refused, last, None, None, ())


@dataclass
class Observed:
    """Load runs beside the pool's samples, the watched requests and /metrics at the end."""

    probes: list[ProbeResult]
    samples: list[Sample]
    watched: list[Watched]
    metrics: dict[str, float] = field(default_factory=dict)

    def total(self, cls: str, what: str) -> int:
        return sum(int(getattr(p.classes[cls], what)) for p in self.probes)

    def refused(self, cls: str) -> int:
        return sum(self.not_ok(cls).values())

    def not_ok(self, cls: str) -> dict[int, int]:
        """`cls`'s answers other than 200, by status (a 504 is no refusal the server counts)."""
        out: dict[int, int] = {}
        for p in self.probes:
            for status, n in p.classes[cls].statuses.items():
                if status != 200:
                    out[status] = out.get(status, 0) + n
        return out

    @property
    def lost(self) -> int:
        return sum(p.lost for p in self.probes) + sum(w.status == 0 for w in self.watched)

    @property
    def wrong(self) -> int:
        return sum(p.wrong for p in self.probes) + \
            sum(w.status == 200 and not w.right for w in self.watched)

    def over_budget(self, series: str) -> int:
        """Paid observations of `series` (request_duration, queue_wait) over the budget, by
        the server's histogram."""
        name = f"batchgate_{series}_seconds"
        return round(metric(self.metrics, f"{name}_count", tier="paid")
                     - metric(self.metrics, f"{name}_bucket", tier="paid",
                              le=str(PAID_BUDGET_S)))

    def slow_batches(self, over_s: float = 0.15) -> str:
        """Batches the server timed longer than `over_s`, "n of m" (a worker or the core
        short of CPU shows here, not in the queue)."""
        name = "batchgate_batch_duration_seconds"
        total = metric(self.metrics, f"{name}_count")
        return f"{total - metric(self.metrics, f'{name}_bucket', le=str(over_s)):.0f} of " \
               f"{total:.0f}"

    def rejected(self, tier: str) -> dict[str, int]:
        """The server's refusals of `tier`, by reason."""
        prefix, want = "batchgate_rejected_total{", f'tier="{tier}"'
        return {k.split('reason="')[1].split('"')[0]: int(v) for k, v in self.metrics.items()
                if k.startswith(prefix) and want in k and v}


async def offer_watching(
    url: str, config: ProbeConfig, during: Callable[[], Coroutine[Any, Any, None]],
    sample_s: float = 0.5, watch_rps: float = 20.0,
) -> tuple[Observed, float]:
    """Offer `config`'s load while `during` runs (a fault, a node added: it must end by
    itself), sampling the pool and watching free requests until the load ends. Returns what
    was seen and when the load began."""
    samples: list[Sample] = []
    watched: list[Watched] = []
    done = anyio.Event()
    bound = time.monotonic() + 2 * config.duration_s + config.timeout_s + 30
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_pool, url, sample_s, bound, samples, done)
        tg.start_soon(watch, url, watch_rps, bound, config.timeout_s, watched, done)
        tg.start_soon(during)
        result = await run_probe(config)
        began = time.monotonic() - result.wall_s
        done.set()
    seen = Observed([result], samples, watched)
    seen.metrics = await anyio.to_thread.run_sync(fetch_metrics, url)
    return seen, began


__all__ = ["ADMIN", "ADMIN_KEY", "FREE_BUDGET_S", "FREE_KEY", "PAID_BUDGET_S", "PAID_KEY",
           "Observed", "Refusals", "RetryFit", "Sample", "Watched", "first_at",
           "offer_watching", "refusals", "sample_pool", "up_at", "watch"]
