"""What a streamed `POST /v1/batchstring` costs, and how it shares the workers.

    python -m loadtest.bench_stream [--only big,fair,unread,leave] [--runs 3]
        [--fair-duration 60] [--b-rps 20] [--seed 7] [--unread-s 10] [--unread-streams 20]
        [--unread-pad 0] [--rcvbuf 0]

Each section runs its own `batchgate serve --model sim` on 127.0.0.1 (a batch of at most 100
inputs, each answered reversed, after 100 ms: N workers drain at most N x 1,000 items/s):

big     one NDJSON stream of 10,000 inputs (paid key, `X-Request-Timeout-Ms: 10000`) on 10
        workers, after a small warm-up: the time to the first and to the last event from
        sending, the server process's peak RSS over its RSS just before (sampled every 10 ms;
        the workers are other processes), and whether every index came once, as its input
        reversed, with `done` counting them. `--runs` servers, one run each; each and the median.
fair    4 workers, two paid accounts. B sends `--b-rps` single-input JSON requests/s (open
        loop, Poisson, fixed seed, latency from the scheduled send) alone, then beside A's two
        10,000-input streams kept going back to back: B's latency quantiles, A's items/s
        inside the phase, and A's share of what B leaves of the 4,000 items/s. The same on a
        second server with `--fair-share false` (first come, first served within a tier).
unread  2 workers: `--unread-streams` streams of 10,000 opened on raw sockets whose body is
        never read for `--unread-s`: the server's RSS before, at its peak, and 2 s after the
        sockets close, and the inputs that ran meanwhile. A stream's window stops only once
        the sockets' buffers are full, and the events of short inputs mostly fit in the
        kernel's: `--unread-pad N` pads each input with N characters, so that its events
        fill them and the window is what stops the stream.
leave   2 workers: a stream without an Idempotency-Key read for 100 events, then dropped: the
        server's RSS before, at its peak and once the paid queue is empty, and the inputs
        sent to workers (`batchgate_batch_size_sum`) against 10,000: those not yet in a batch
        are withdrawn and never run.

Each section prints the command that reproduces it. Every wait is bounded, and servers are
stopped on every path.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import orjson

from loadtest.probe_results import percentile
from loadtest.server import RunningServer, code_of, fetch_metrics, metric, running_server
from loadtest.streams import (
    BATCHED,
    ROUTE,
    RssPeak,
    StreamCheck,
    StreamRead,
    batched,
    check_events,
    headers,
    inputs,
    read_stream,
)

ROOT = Path(__file__).resolve().parents[1]
KEYS = ROOT / "examples" / "keys.toml"
PAID_KEY = "paid-demo-key"  # examples/keys.toml: tier paid, account acme
A_KEY, B_KEY = "bench-stream-a", "bench-stream-b"
STREAM_INPUTS = 10_000
ITEMS_PER_WORKER_S = 1_000.0  # sim: 100 inputs per 100 ms batch
MIB = 1024 * 1024
SECTIONS = ("big", "fair", "unread", "leave")


# -- the pure parts --------------------------------------------------------------------------
def quantiles_ms(seconds: Sequence[float]) -> tuple[float, float, float]:
    """P50/P95/P99 in ms (nearest rank); NaN when there are none."""
    if not seconds:
        return math.nan, math.nan, math.nan
    xs = sorted(seconds)
    p50, p95, p99 = (percentile(xs, q) * 1e3 for q in (0.5, 0.95, 0.99))
    return p50, p95, p99


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson send times (seconds from the start) at `rate`/s within `duration_s`."""
    rng, at, out = random.Random(seed), 0.0, []
    while (at := at + rng.expovariate(rate)) < duration_s:
        out.append(at)
    return out


def share_left(a_items_s: float, b_items_s: float, capacity: float) -> tuple[float, float]:
    """What B leaves of `capacity` items/s, and A's share of it."""
    left = capacity - b_items_s
    return left, (a_items_s / left if left > 0 else math.nan)


def two_account_keys() -> str:
    """A keys file of two paid keys of two accounts, A and B, no anonymous access."""
    return "anonymous = false\n" + "".join(
        f'[[keys]]\nkey = "{key}"\ntier = "paid"\naccount = "{account}"\n'
        for key, account in ((A_KEY, "acct-a"), (B_KEY, "acct-b")))


def command(section: str, a: argparse.Namespace) -> str:
    """The command line that reproduces `section` as `a` ran it."""
    opts = {"big": f"--runs {a.runs}",
            "fair": f"--fair-duration {a.fair_duration:g} --b-rps {a.b_rps:g} --seed {a.seed}",
            "unread": f"--unread-s {a.unread_s:g} --unread-streams {a.unread_streams}"
                      f"{f' --unread-pad {a.unread_pad}' if a.unread_pad else ''}"
                      f"{f' --rcvbuf {a.rcvbuf}' if a.rcvbuf else ''}",
            "leave": ""}[section]
    return f"python -m loadtest.bench_stream --only {section} {opts}".rstrip()


def _f(x: float, width: int = 7, digits: int = 1) -> str:
    return f"{'-':>{width}}" if math.isnan(x) else f"{x:>{width}.{digits}f}"


# -- measuring -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BigRun:
    status: int
    first_ms: float
    last_ms: float
    rss_mib: float  # just before the stream
    peak_delta_mib: float
    check: StreamCheck | None


async def big_run(srv: RunningServer) -> BigRun:
    texts = inputs(STREAM_INPUTS)
    async with httpx.AsyncClient(timeout=30.0) as client:
        await read_stream(client, srv.url, inputs(10, "warm"), PAID_KEY, 10_000, StreamRead())
        out = StreamRead()
        with RssPeak(srv.pid) as rss:
            sent = time.monotonic()
            await read_stream(client, srv.url, texts, PAID_KEY, 10_000, out)
    t = [(x - sent) * 1e3 for x in out.times[:1] + out.times[-1:]] or [math.nan, math.nan]
    check = check_events(out.events, texts) if out.status == 200 else None
    return BigRun(out.status, t[0], t[-1], rss.before / MIB, (rss.peak - rss.before) / MIB,
                  check)


def big_line(name: str, r: BigRun) -> str:
    return (f"| {name:<6} | {r.status or '-':>3} | {_f(r.first_ms)} | {_f(r.last_ms)} | "
            f"{_f(r.rss_mib)} | {_f(r.peak_delta_mib)} | {r.check or '-'} |")


def big(a: argparse.Namespace) -> bool:
    print("| run    | st  | first ms | last ms | RSS MiB | +peak MiB | events |")
    print("|--------|-----|---------:|--------:|--------:|----------:|--------|")
    runs = []
    for n in range(a.runs):
        with running_server(10, "sim", ["--keys", str(KEYS)]) as srv:
            runs.append(run := anyio.run(big_run, srv))
        print(big_line(str(n + 1), run), flush=True)
    if runs:
        first, last, rss, delta = (statistics.median(getattr(r, f) for r in runs)
                                   for f in ("first_ms", "last_ms", "rss_mib", "peak_delta_mib"))
        print(big_line("median", BigRun(0, first, last, rss, delta, None)))
    return all(r.check is not None and r.check.ok for r in runs)


# -- fair ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Phase:
    server: str
    name: str
    duration_s: float
    b_latency: list[float] = field(default_factory=list)  # seconds, right answers only
    b_sent: int = 0
    b_errors: Counter[str] = field(default_factory=Counter)
    a_reads: list[StreamRead] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)  # monotonic: B's first scheduled send, + duration

    def a_items(self) -> int:
        start, end = self.window
        return sum(1 for r in self.a_reads for e, t in zip(r.events, r.times, strict=True)
                   if "output" in e and start <= t < end)

    def a_errors(self) -> Counter[str]:
        out: Counter[str] = Counter(r.error for r in self.a_reads if r.error)
        for r in self.a_reads:
            out.update(f"event {e['error'].get('code')}" for e in r.events if "error" in e)
        return out


async def b_one(client: httpx.AsyncClient, url: str, due: float, text: str,
                phase: Phase) -> None:
    await anyio.sleep_until(due)
    try:
        r = await client.post(url + ROUTE, content=orjson.dumps({"inputs": [text]}),
                              headers=headers(B_KEY, 5_000, "application/json"))
    except httpx.HTTPError as exc:
        phase.b_errors[type(exc).__name__] += 1
        return
    if r.status_code != 200:
        phase.b_errors[code_of(r)] += 1
    elif r.json().get("outputs") != [text[::-1]]:
        phase.b_errors["wrong"] += 1
    else:
        phase.b_latency.append(time.monotonic() - due)


async def b_load(client: httpx.AsyncClient, url: str, a: argparse.Namespace,
                 phase: Phase) -> None:
    """B's open loop: each request its own task, sent at its scheduled time."""
    start = time.monotonic() + 0.05
    phase.window = (start, start + phase.duration_s)
    times = arrivals(a.b_rps, phase.duration_s, a.seed)
    phase.b_sent = len(times)
    async with anyio.create_task_group() as tg:
        for n, at in enumerate(times):
            tg.start_soon(b_one, client, url, start + at, f"b-{n:06d}-xyz", phase)


async def a_loop(client: httpx.AsyncClient, url: str, phase: Phase,
                 flowing: anyio.Event) -> None:
    """A's streams, one after another until cancelled."""
    texts = inputs(STREAM_INPUTS, "a")
    while True:
        phase.a_reads.append(out := StreamRead())
        await read_stream(client, url, texts, A_KEY, 30_000, out, flowing=flowing)
        if out.status != 200:
            await anyio.sleep(0.1)  # refused: no tight loop of refusals


async def run_phase(url: str, a: argparse.Namespace, phase: Phase, with_a: bool) -> None:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=128)
    bound = phase.duration_s + 60.0  # B's tail is bounded by its requests' timeouts
    async with httpx.AsyncClient(limits=limits, timeout=15.0) as client, \
            anyio.create_task_group() as tg:
        tg.cancel_scope.deadline = anyio.current_time() + bound
        if with_a:
            flowing = anyio.Event()
            for _ in range(2):
                tg.start_soon(a_loop, client, url, phase, flowing)
            with anyio.move_on_after(15.0):  # B starts once A's streams are flowing
                await flowing.wait()
        await b_load(client, url, a, phase)
        tg.cancel_scope.cancel()


def fair_line(p: Phase, workers: int) -> str:
    p50, p95, p99 = quantiles_ms(p.b_latency)
    a_s = p.a_items() / p.duration_s if p.a_reads else math.nan
    b_s = len(p.b_latency) / p.duration_s
    left, share = share_left(a_s, b_s, workers * ITEMS_PER_WORKER_S)
    errors = dict(p.b_errors) or "-"
    a_err = dict(p.a_errors()) or "-"
    return (f"| {p.server:<4} | {p.name:<7} | {p.b_sent:>5} | {len(p.b_latency):>5} | "
            f"{_f(p50)} | {_f(p95)} | {_f(p99)} | {errors} | {_f(a_s, 7, 0)} | "
            f"{_f(left, 6, 0)} | {_f(share * 100, 6)} | {len(p.a_reads)} | {a_err} |")


def fair(a: argparse.Namespace) -> bool:
    workers = 4
    print(f"| srv  | phase   | B sent | B ok | B p50 | B p95 | B p99 | B errors | A items/s | "
          f"left | A % left | A streams | A errors |\n|{'---|' * 13}")
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        keys = Path(tmp) / "keys.toml"
        keys.write_text(two_account_keys())
        keys.chmod(0o600)
        for server, extra in (("fair", []), ("fifo", ["--fair-share", "false"])):
            with running_server(workers, "sim", ["--keys", str(keys), *extra]) as srv:
                for name, with_a in (("B alone", False), ("A + B", True)):
                    phase = Phase(server, name, a.fair_duration)
                    anyio.run(run_phase, srv.url, a, phase, with_a)
                    print(fair_line(phase, workers), flush=True)
    return True


# -- unread ----------------------------------------------------------------------------------
def raw_stream_request(texts: Sequence[str], key: str, timeout_ms: int) -> bytes:
    body = orjson.dumps({"inputs": list(texts)})
    head = "".join(f"{k}: {v}\r\n" for k, v in headers(key, timeout_ms).items())
    return (f"POST {ROUTE} HTTP/1.1\r\nHost: batchgate\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_head(sock: socket.socket) -> int:
    """Read until the end of the response head (and whatever came with it); its status."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536 and (chunk := sock.recv(4096)):
        data += chunk
    first = data.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) > 1 and first[1].isdigit() else 0


def unread(a: argparse.Namespace) -> bool:
    texts = inputs(STREAM_INPUTS, pad=a.unread_pad)
    request = raw_stream_request(texts, PAID_KEY, 60_000)
    with running_server(2, "sim", ["--keys", str(KEYS)]) as srv:
        with httpx.Client(timeout=30.0) as client:  # warm-up, read whole
            client.post(srv.url + ROUTE, content=orjson.dumps({"inputs": inputs(10, "w")}),
                        headers=headers(PAID_KEY, 10_000)).read()
        ran_before = metric(fetch_metrics(srv.url), BATCHED)
        with RssPeak(srv.pid) as rss, contextlib.ExitStack() as socks:
            statuses: Counter[int] = Counter()
            for _ in range(a.unread_streams):
                sock = socks.enter_context(socket.socket())
                if a.rcvbuf:  # before connecting: the window it offers is set then
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, a.rcvbuf)
                sock.settimeout(15.0)
                sock.connect(("127.0.0.1", srv.port))
                sock.sendall(request)
                statuses[read_head(sock)] += 1
            time.sleep(a.unread_s)
            peak = rss.peak
            ran = metric(fetch_metrics(srv.url), BATCHED) - ran_before
        time.sleep(2.0)
        after = rss.rss()
    print(f"| streams | heads | RSS before MiB | peak MiB | growth MiB | 2 s after close MiB | "
          f"inputs run while unread |\n|{'---|' * 7}")
    print(f"| {a.unread_streams} | {dict(statuses)} | {rss.before / MIB:.1f} | {peak / MIB:.1f} "
          f"| {(peak - rss.before) / MIB:.1f} | {after / MIB:.1f} | {ran:.0f} of "
          f"{a.unread_streams * STREAM_INPUTS} |")
    return True


# -- leave -----------------------------------------------------------------------------------
async def wait_drained(url: str, bound_s: float = 30.0) -> float:
    """Poll until the paid queue is empty; seconds it took (NaN: not within `bound_s`)."""
    start = time.monotonic()
    with anyio.move_on_after(bound_s):
        while True:
            samples = await anyio.to_thread.run_sync(fetch_metrics, url)
            if metric(samples, "batchgate_queue_depth", tier="paid") == 0:
                return time.monotonic() - start
            await anyio.sleep(0.05)
    return math.nan


async def leave_run(srv: RunningServer) -> str:
    texts = inputs(STREAM_INPUTS)
    async with httpx.AsyncClient(timeout=30.0) as client:
        await read_stream(client, srv.url, inputs(10, "warm"), PAID_KEY, 10_000, StreamRead())
        ran_before = await batched(srv.url)
        out = StreamRead()
        with RssPeak(srv.pid) as rss:
            await read_stream(client, srv.url, texts, PAID_KEY, 30_000, out, limit=100)
            drained = await wait_drained(srv.url)
            await anyio.sleep(0.5)  # the batches already out end (100 ms each)
            ran = await batched(srv.url) - ran_before
            after = rss.rss()
    read = f"{out.status} {len(out.events)} events{' ' + out.error if out.error else ''}"
    return (f"| {read} | {rss.before / MIB:.1f} | {rss.peak / MIB:.1f} | {after / MIB:.1f} | "
            f"{_f(drained * 1e3, 1, 0)} | {ran:.0f} of {STREAM_INPUTS} |")


def leave(a: argparse.Namespace) -> bool:
    with running_server(2, "sim", ["--keys", str(KEYS)]) as srv:
        line = anyio.run(leave_run, srv)
    print(f"| read | RSS before MiB | peak MiB | after MiB | queue empty after ms | "
          f"inputs sent to workers |\n|{'---|' * 6}\n{line}")
    return True


# -- main ------------------------------------------------------------------------------------
def sections(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"sections are {','.join(SECTIONS)}; got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_stream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", type=sections, default=list(SECTIONS),
                   help=f"comma-separated sections (default {','.join(SECTIONS)})")
    p.add_argument("--runs", type=int, default=3, help="big: runs, one server each")
    p.add_argument("--fair-duration", type=float, default=60.0, help="fair: seconds a phase")
    p.add_argument("--b-rps", type=float, default=20.0, help="fair: B's requests/s")
    p.add_argument("--seed", type=int, default=7, help="fair: B's Poisson schedule")
    p.add_argument("--unread-s", type=float, default=10.0,
                   help="unread: seconds unread (keep below the 30 s body timeout)")
    p.add_argument("--unread-streams", type=int, default=20)
    p.add_argument("--unread-pad", type=int, default=0,
                   help="unread: characters added to each input, so that its events outgrow "
                   "the sockets' buffers (1000: a stream's events are about 10 MB)")
    p.add_argument("--rcvbuf", type=int, default=0,
                   help="unread: the sockets' SO_RCVBUF in bytes (0: the kernel's, which "
                   "with the server's send buffer can hold a whole stream)")
    a = p.parse_args(argv)
    run = {"big": big, "fair": fair, "unread": unread, "leave": leave}
    ok = True
    for name in (s for s in SECTIONS if s in a.only):
        print(f"\n## {name}\n\n    {command(name, a)}\n", flush=True)
        ok = run[name](a) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
