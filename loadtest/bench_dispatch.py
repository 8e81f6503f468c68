"""Dispatch benchmark: the service's hot path without HTTP, against real `sim` workers.

`api.door.Service` composes the batcher, the failover dispatcher and the worker pool
exactly as `batchgate serve` does (sim processes padded to 100 ms a batch); items go in
through `batcher.admit`, as a request's do, on an open-loop Poisson schedule, and every
latency runs from the item's *scheduled* arrival, so a slow dispatcher cannot hide its own
queueing. Admission budgets are set past reach: this measures dispatch, not refusal.

Read each row against the contract's physical limits (docs/benchmarks.md): no answer before one
batch's latency, and N workers answer at most N full batches per batch latency. `cpu
us/item` is this process's CPU (batcher, failover, pool IPC and the generator itself; the
worker processes excluded) over the items answered; `gen` is the generator's share,
measured alone on the same schedule with a no-op dispatcher, so `disp = cpu - gen` is the
dispatch path's (each of the generator's event-loop wakeups costs CPU whatever the rate, so
its share weighs most on low rates).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson

from api.config import DEFAULT_TIERS, Settings, Workers
from api.door import Service
from api.metrics import Metrics
from batcher import BatcherStatistics, BatchgateError, Closed, Item, ItemId, Tier
from loadtest.plan import poisson
from loadtest.probe_results import Latency

DEFAULT_RATES = (100.0, 1_000.0, 5_000.0, 10_000.0, 20_000.0)
REASONS = ("full", "timeout", "idle", "retry")
ITEM_TIMEOUT_S = 60.0
CALIBRATE_S = 3.0  # longest generator-alone run per rate
MIN_SLEEP_S = 0.001  # uvloop spins on shorter timers (asyncio's epoll rounds up to 1 ms)
SETTLE_S = 15.0  # after the last arrival, how long answers may take before counting as lost


@dataclass(frozen=True, slots=True)
class Row:
    rate: float
    workers: int
    idle_trigger: bool
    offered_rps: float
    achieved_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_fill: float
    flushes: dict[str, int]
    cpu_us_per_item: float
    gen_us_per_item: float
    dispatch_us_per_item: float
    items: int
    ok: int
    wrong: int  # answered with another string than its input reversed
    errors: int  # answered with an error, or refused at the door
    lost: int  # never answered
    lag_p95_ms: float  # how late the generator reached each scheduled arrival


class _Tally:
    """The ItemSink of every item: when each was answered rightly (NaN: not answered,
    -1: answered wrongly or with an error)."""

    def __init__(self, count: int) -> None:
        self.done_at = [math.nan] * count
        self.answered = self.wrong = self.errors = self.duplicates = 0
        self.count = count
        self.all_done = anyio.Event()
        if count == 0:
            self.all_done.set()

    def item_done(self, item: Item, result: str | BaseException) -> None:
        i = item.id
        if self.done_at[i] == self.done_at[i]:  # not NaN: answered before
            self.duplicates += 1
            return
        self.done_at[i] = -1.0
        if isinstance(result, BaseException):
            self.errors += 1
        elif result != item.text[::-1]:
            self.wrong += 1
        else:
            self.done_at[i] = time.monotonic()
        self.answered += 1
        if self.answered == self.count:
            self.all_done.set()


Admit = Callable[[list[Item], float], None]


async def _offer(admit: Admit, arrivals: list[float], tally: _Tally) -> list[float]:
    """Admit each item once its scheduled time has come; return the lag of each."""
    lags: list[float] = []
    n, i, tick = len(arrivals), 0, MIN_SLEEP_S if _on_uvloop() else 0.0
    while i < n:
        now = time.monotonic()
        while i < n and arrivals[i] <= now:
            at = arrivals[i]
            item = Item(ItemId(i), f"i{i}", Tier.PAID, at, at + ITEM_TIMEOUT_S, tally)
            try:
                admit([item], ITEM_TIMEOUT_S)
            except (BatchgateError, Closed) as exc:
                tally.item_done(item, exc)
            lags.append(now - at)
            i += 1
        if i < n:
            await anyio.sleep(max(tick, arrivals[i] - time.monotonic()))
    return lags


def _on_uvloop() -> bool:
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


def service_for(workers: int, idle_trigger: bool) -> Service:
    """The real composition, with admission budgets no load can exceed."""
    settings = Settings(model="sim", workers=Workers(workers), idle_trigger=idle_trigger,
                        queue_capacity=10_000_000, ready_timeout_s=120.0)
    tiers = {t: dataclasses.replace(p, budget_ms=1e9, timeout_ms=1e9)
             for t, p in DEFAULT_TIERS.items()}
    return Service(settings, Metrics(), tiers)


async def calibrate(rate: float, duration: float, seed: int = 1) -> float:
    """CPU us per item of the generator alone: items made, offered and answered at once."""
    offsets = poisson(rate, min(duration, CALIBRATE_S), seed)
    tally = _Tally(len(offsets))

    def admit(items: list[Item], timeout: float) -> None:
        for item in items:
            tally.item_done(item, item.text[::-1])

    cpu0 = time.process_time()
    t0 = time.monotonic() + 0.01
    await _offer(admit, [t0 + x for x in offsets], tally)
    return (time.process_time() - cpu0) * 1e6 / max(1, len(offsets))


async def measure(rate: float, workers: int, idle_trigger: bool, duration: float,
                  seed: int = 1, gen_us: float = 0.0) -> Row:
    """Start the service, offer `rate` items/s for `duration` s, drain it, return the row."""
    offsets = poisson(rate, duration, seed)
    tally = _Tally(len(offsets))
    service = service_for(workers, idle_trigger)
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        before = service.core.statistics().batcher
        cpu0 = time.process_time()
        t0 = time.monotonic() + 0.01
        arrivals = [t0 + x for x in offsets]
        lags = await _offer(service.core.admit, arrivals, tally)
        with anyio.move_on_after(SETTLE_S):
            await tally.all_done.wait()
        cpu = time.process_time() - cpu0
        after = service.core.statistics().batcher
        lost = tally.count - tally.answered  # before draining answers them with errors
        await service.drain()
        tg.cancel_scope.cancel()
    return _row(rate, workers, idle_trigger, duration, arrivals, tally, lags, lost,
                (cpu, gen_us), (before, after))


def _row(rate: float, workers: int, idle: bool, duration: float, arrivals: list[float],
         tally: _Tally, lags: list[float], lost: int, cpu_gen: tuple[float, float],
         stats: tuple[BatcherStatistics, BatcherStatistics]) -> Row:
    before, after = stats
    cpu_us = cpu_gen[0] * 1e6 / max(1, tally.answered)
    done = [d for d in tally.done_at if d > 0]  # NaN compares False
    lat = Latency.of([d - a for d, a in zip(tally.done_at, arrivals, strict=True) if d > 0])
    batches = after.batches - before.batches
    span = max(done) - min(done) if len(done) > 1 else 0.0
    ok = tally.answered - tally.wrong - tally.errors
    return Row(
        rate=rate, workers=workers, idle_trigger=idle, offered_rps=len(arrivals) / duration,
        achieved_rps=(ok - 1) / span if span > 0 else 0.0,
        p50_ms=lat.p50 * 1e3, p95_ms=lat.p95 * 1e3, p99_ms=lat.p99 * 1e3, max_ms=lat.max * 1e3,
        mean_fill=(after.items - before.items) / batches if batches else 0.0,
        flushes={k: after.flushes[k] - before.flushes[k] for k in REASONS},
        cpu_us_per_item=cpu_us, gen_us_per_item=cpu_gen[1],
        dispatch_us_per_item=cpu_us - cpu_gen[1], items=len(arrivals), ok=ok,
        wrong=tally.wrong + tally.duplicates, errors=tally.errors, lost=lost,
        lag_p95_ms=Latency.of(lags).p95 * 1e3,
    )


HEADER = (
    f"{'rate':>6} {'wk':>3} {'idle':>4} {'offer':>6} {'achvd':>6} {'p50':>6} {'p95':>6} "
    f"{'p99':>6} {'fill':>5} {'flush f/t/i/r':<18} {'cpu':>5} {'gen':>5} {'disp':>5} {'wrong':>5} "
    f"{'err':>4} {'lost':>4} {'lag95':>5}"
)


def format_row(r: Row) -> str:
    flush = "/".join(str(r.flushes[k]) for k in REASONS)
    return (
        f"{r.rate:>6.0f} {r.workers:>3} {'on' if r.idle_trigger else 'off':>4} "
        f"{r.offered_rps:>6.0f} {r.achieved_rps:>6.0f} {r.p50_ms:>6.1f} {r.p95_ms:>6.1f} "
        f"{r.p99_ms:>6.1f} {r.mean_fill:>5.1f} {flush:<18} {r.cpu_us_per_item:>5.1f} "
        f"{r.gen_us_per_item:>5.1f} {r.dispatch_us_per_item:>5.1f} "
        f"{r.wrong:>5} {r.errors:>4} {r.lost:>4} {r.lag_p95_ms:>5.1f}"
    )


def plot(rows: Sequence[Row], out: Path) -> str:
    """Write P50/P95 and mean fill against offered load, if matplotlib is importable."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return f"matplotlib is not installed: no plot written to {out}"
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 7))
    for idle in sorted({r.idle_trigger for r in rows}, reverse=True):
        rs = sorted((r for r in rows if r.idle_trigger == idle), key=lambda r: r.offered_rps)
        x, tag = [r.offered_rps for r in rs], f"idle trigger {'on' if idle else 'off'}"
        top.plot(x, [r.p50_ms for r in rs], "o-", label=f"P50, {tag}")
        top.plot(x, [r.p95_ms for r in rs], "s--", label=f"P95, {tag}")
        bottom.plot(x, [r.mean_fill for r in rs], "o-", label=tag)
    top.axhline(100, color="grey", lw=0.8, label="batch latency (100 ms)")
    top.set_ylabel("latency from scheduled arrival (ms)")
    bottom.set_ylabel("mean batch fill (items)")
    bottom.set_xlabel("offered load (items/s)")
    bottom.set_xscale("log")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return f"plot written to {out}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_dispatch",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES),
                   metavar="ITEMS_PER_S")
    p.add_argument("--workers", type=int, nargs="+", metavar="N",
                   help="one count for every rate, or one per rate (default ceil(rate/1000)+2)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds offered per run")
    p.add_argument("--idle-trigger", choices=["on", "off", "both"], default="on")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                   help="event loop (`batchgate serve` runs on uvloop when installed)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the rows as JSON")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="P50/P95 and fill vs load")
    a = p.parse_args(argv)
    workers = a.workers or [math.ceil(r / 1000) + 2 for r in a.rates]
    if len(workers) == 1:
        workers = workers * len(a.rates)
    if len(workers) != len(a.rates) or min(workers) < 1 or min(a.rates) <= 0 \
            or a.duration <= 0:
        p.error("give positive rates and duration, and one worker count (>= 1) or one per rate")
    idles = {"on": [True], "off": [False], "both": [True, False]}[a.idle_trigger]
    options = {"use_uvloop": a.loop == "uvloop"}
    print(f"open-loop Poisson, {a.duration:g} s per run on {a.loop}, sim workers at 100 ms a "
          "batch; latency (ms) from the scheduled arrival; floor 100 ms, capacity 1,000 items/s "
          "per worker; cpu/gen/disp: this process's CPU us per item: all, generator alone, "
          "the rest")
    print(HEADER, flush=True)
    rows: list[Row] = []
    for rate, n in zip(a.rates, workers, strict=True):
        gen_us = anyio.run(calibrate, rate, a.duration, a.seed, backend_options=options)
        for idle in idles:
            rows.append(anyio.run(measure, rate, n, idle, a.duration, a.seed, gen_us,
                                  backend_options=options))
            print(format_row(rows[-1]), flush=True)
    if a.json:
        a.json.write_bytes(orjson.dumps([asdict(r) for r in rows], option=orjson.OPT_INDENT_2))
    if a.plot:
        print(plot(rows, a.plot))
    return 1 if any(r.wrong or r.lost or r.errors for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
