"""batchgate beside the plain pull batcher: same load generator, same schedule, same batch fn.

The reference (`../shared/bench/baseline_app.py --policy pull`) is a 60-line size-or-time
batcher on Starlette whose workers are asyncio tasks. batchgate serves the same batch
function (`batchfn:batchstring_blocking`, 100 ms in a worker process) with every feature on.
Both are driven by the shared open-loop generator (`loadgen.py`: Poisson, fixed seed,
latency from the scheduled send, every answer checked), one run after the other, so the
only difference between two rows is the server. batchgate's rows also read its own
histograms over the measured window: the workers' idle gap and this process's GC pauses.

The reference and the generator run in their own environment (`../shared/bench/README.md`:
starlette, uvicorn, uvloop, httptools, aiohttp, psutil), named by `--ref-python`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.server import cpu_seconds, door_pid, fetch_metrics, free_port, running_server

ROOT = Path(__file__).resolve().parents[1]
KEYS = ROOT / "loadtest" / "reference-keys.toml"
DEFAULT_RATES = ("100@1", "100@2", "100@10", "800@1", "1600@2")


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    server: str  # "plain" or "batchgate"
    run: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    sent: int
    ok: int
    wrong: int
    errors: int
    timeouts: int
    cpu_ms_per_req: float  # the server process (batchgate: not its workers), warm-up included
    generator_behind: bool
    idle_gap_p99_ms: float = math.nan  # batchgate only, from its histograms
    gc_pause_p99_ms: float = math.nan
    gc_pauses: int = 0


def histogram_quantile(
    before: Mapping[str, float], after: Mapping[str, float], name: str, q: float,
) -> tuple[float, int]:
    """The q-quantile (as Prometheus computes it, linear within a bucket) of the
    observations a histogram gained between two scrapes, summed over its label sets;
    and how many there were."""
    buckets: dict[float, float] = {}
    prefix = name + "_bucket{"
    for key, value in after.items():
        if not key.startswith(prefix):
            continue
        le = key.split('le="', 1)[1].split('"', 1)[0]
        bound = math.inf if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + value - before.get(key, 0.0)
    bounds = sorted(buckets)
    total = buckets.get(math.inf, 0.0)
    if not total:
        return math.nan, 0
    rank, lower, seen = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == math.inf:
                return lower, int(total)
            inside = (rank - seen) / (count - seen) if count > seen else 1.0
            return lower + (bound - lower) * inside, int(total)
        lower, seen = bound, count
    return lower, int(total)


def wait_port(port: int, proc: subprocess.Popen[bytes], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the reference server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the reference server did not listen in time")


@contextmanager
def plain_server(python: str, bench: Path, workers: int) -> Iterator[tuple[str, int]]:
    """The reference pull batcher on a free port: (url, pid)."""
    port = free_port()
    cmd = [python, str(bench / "baseline_app.py"), "--policy", "pull", "--port", str(port),
           "--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}/predict", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def generate(python: str, bench: Path, url: str, rps: float, duration: float, warmup: float,
             seed: int, proto: str = "json") -> dict[str, object]:
    """One bounded run of the shared generator, its bodies in `proto` (`json`: /v1's,
    `kserve`: the Open Inference Protocol's); its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python, str(bench / "loadgen.py"), "--url", url, "--proto", proto, "--rate",
               str(rps), "--duration", str(duration), "--warmup", str(warmup), "--seed",
               str(seed), "--quiet", "--out", str(out)]
        subprocess.run(cmd, check=True, timeout=warmup + duration + 60)
        result: dict[str, object] = json.loads(out.read_text())
        return result


def _row(scenario: str, server: str, run: int, result: Mapping[str, object], cpu: float,
         **extra: float | int) -> Row:
    lat = result["lat_ms"]
    assert isinstance(lat, dict)
    sent = int(result["sent"])  # type: ignore[call-overload]
    everything = int(result["total_sent_incl_warmup"])  # type: ignore[call-overload]
    return Row(
        scenario=scenario, server=server, run=run, p50_ms=lat["p50"] or math.nan,
        p95_ms=lat["p95"] or math.nan, p99_ms=lat["p99"] or math.nan, sent=sent,
        ok=int(result["ok"]), wrong=int(result["wrong"]),  # type: ignore[call-overload]
        errors=int(result["errors"]), timeouts=int(result["timeouts"]),  # type: ignore[call-overload]
        cpu_ms_per_req=cpu * 1e3 / max(1, everything),
        generator_behind=bool(result["generator_fell_behind"]), **extra,  # type: ignore[arg-type]
    )


def measure_plain(a: argparse.Namespace, scenario: str, rps: float, workers: int,
                  run: int) -> Row:
    with plain_server(a.ref_python, a.bench_dir, workers) as (url, pid):
        generate(a.ref_python, a.bench_dir, url, rps, a.warmup_s, 0.5, a.seed + 1)  # warm
        cpu0 = cpu_seconds(pid)
        result = generate(a.ref_python, a.bench_dir, url, rps, a.duration, a.warmup, a.seed)
        cpu = cpu_seconds(pid) - cpu0
    return _row(scenario, "plain", run, result, cpu)


def measure_batchgate(a: argparse.Namespace, scenario: str, rps: float, workers: int,
                      run: int) -> Row:
    args = ["--keys", str(a.keys), "--batch-latency-ms", "0", *a.server_arg]
    paths = [str(a.bench_dir), str(a.root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {"PYTHONPATH": os.pathsep.join(paths)}  # the caller's too: hooks, profilers
    with running_server(workers, "batchfn:batchstring_blocking", args, env=env,
                        cwd=a.root) as srv:
        url = srv.url + "/v1/batchstring"
        generate(a.ref_python, a.bench_dir, url, rps, a.warmup_s, 0.5, a.seed + 1)  # warm
        before = fetch_metrics(srv.url)
        door = door_pid(srv)  # a cell's core process, as the single process
        cpu0 = cpu_seconds(door)
        result = generate(a.ref_python, a.bench_dir, url, rps, a.duration, a.warmup, a.seed)
        cpu = cpu_seconds(door) - cpu0
        after = fetch_metrics(srv.url)
    gap, _ = histogram_quantile(before, after, "batchgate_worker_idle_gap_seconds", 0.99)
    gc_p99, pauses = histogram_quantile(before, after, "batchgate_gc_pause_seconds", 0.99)
    return _row(scenario, "batchgate", run, result, cpu, idle_gap_p99_ms=gap * 1e3,
                gc_pause_p99_ms=gc_p99 * 1e3, gc_pauses=pauses)


HEADER = (f"{'scenario':<10} {'server':<10} {'run':>3} {'p50':>6} {'p95':>6} {'p99':>6} "
          f"{'sent':>6} {'ok':>6} {'bad':>4} {'cpu ms/req':>10} {'gap p99':>8} "
          f"{'gc p99':>7} {'gcs':>5} gen")


def format_row(r: Row) -> str:
    bad = r.wrong + r.errors + r.timeouts
    return (f"{r.scenario:<10} {r.server:<10} {r.run:>3} {r.p50_ms:>6.1f} {r.p95_ms:>6.1f} "
            f"{r.p99_ms:>6.1f} {r.sent:>6} {r.ok:>6} {bad:>4} {r.cpu_ms_per_req:>10.3f} "
            f"{r.idle_gap_p99_ms:>8.2f} {r.gc_pause_p99_ms:>7.2f} {r.gc_pauses:>5} "
            f"{'BEHIND' if r.generator_behind else 'ok'}")


def generator_arguments(p: argparse.ArgumentParser, rates: Sequence[str]) -> None:
    """The options of a benchmark that drives servers with the shared generator, one after
    the other, beside the plain batcher (this module's and `loadtest.bench_protocols`)."""
    p.add_argument("--rates", nargs="+", default=list(rates), metavar="RPS@WORKERS")
    p.add_argument("--runs", type=int, default=2, help="runs of each server per scenario")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=3.0, help="generator's own warm-up")
    p.add_argument("--warmup-s", type=float, default=3.0, help="a separate warm-up run first")
    p.add_argument("--seed", type=int, default=1800)
    p.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    p.add_argument("--ref-python", default=str(Path.home() / ".cache/refbench/bin/python"))
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the batchgate checkout to serve (e.g. a worktree of an older commit)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the rows as JSON")


def scenarios(specs: Sequence[str]) -> Iterator[tuple[str, float, int]]:
    """Each `RPS@WORKERS` of `--rates`: itself, its rate and its workers (1 if not said)."""
    for spec in specs:
        rps_text, _, workers_text = spec.partition("@")
        yield spec, float(rps_text), int(workers_text or 1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_reference",
                                description=__doc__.split("\n\n")[0])
    generator_arguments(p, DEFAULT_RATES)
    p.add_argument("--keys", type=Path, default=KEYS)
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more flag for batchgate serve (repeatable)")
    p.add_argument("--only", choices=["plain", "batchgate"], help="run one server only")
    a = p.parse_args(argv)
    print(f"open loop, Poisson, seed {a.seed}, {a.duration:g} s per run; ms from the scheduled "
          "send; plain = ../shared/bench pull batcher; gap/gc: batchgate's idle-gap and GC-pause "
          "P99 (ms) over the run", flush=True)
    print(HEADER, flush=True)
    rows: list[Row] = []
    for spec, rps, workers in scenarios(a.rates):
        for run in range(1, a.runs + 1):
            for name, measure in (("plain", measure_plain), ("batchgate", measure_batchgate)):
                if a.only in (None, name):
                    rows.append(measure(a, spec, rps, workers, run))
                    print(format_row(rows[-1]), flush=True)
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.wrong for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
