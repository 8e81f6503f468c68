"""What the Open Inference Protocol and traces cost over HTTP, beside the plain batcher.

    python -m loadtest.bench_protocols [--rates 800@1 3000@4] [--runs 2] [--duration 20]
        [--variants plain v1 v2 v1-traced] [--before-root DIR] [--json OUT]

Each variant serves the same batch function (`batchfn:batchstring_blocking`, 100 ms in a
worker process) and is driven by the shared open-loop generator (`../shared/bench/loadgen.py`:
Poisson, fixed seed, latency from the scheduled send, every answer checked), one after the
other on the same schedule:

- `plain`: the reference pull batcher (`../shared/bench/baseline_app.py --policy pull`);
- `v1`: batchgate's own `POST /v1/batchstring` (the generator's `json` body);
- `v2`: `POST /v2/models/default/infer`, the generator's `kserve` body (one BYTES tensor);
- `v1-traced`: `/v1` with `--otlp-endpoint` at a local sink that takes every export and
  reads nothing of it (a collector elsewhere costs this host only the export), every request
  traced; `v1-traced-10`: a tenth of them (`--otlp-sample 0.1`);
- `v1-before`: `/v1` served from `--before-root` (a worktree of the commit before).

CPU is the door's process (a cell's core, or the single process) and, in `all`, its workers
and every other child too, per request sent (warm-up included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.bench_reference import (
    KEYS,
    generate,
    generator_arguments,
    plain_server,
    scenarios,
    wait_port,
)
from loadtest.server import cpu_seconds, door_pid, free_port, running_server

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "v1", "v2", "v1-traced", "v1-traced-10", "v1-before")
PATHS = {"v1": ("/v1/batchstring", "json"), "v2": ("/v2/models/default/infer", "kserve")}
SINK = """
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    variant: str
    run: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    sent: int
    ok: int
    bad: int
    cpu_ms_per_req: float  # the door's process
    all_cpu_ms_per_req: float  # the door's process and every child (workers, gateways)
    generator_behind: bool


@contextmanager
def otlp_sink() -> Iterator[str]:
    """A local OTLP/HTTP endpoint that answers every export 200 and keeps nothing."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SINK, str(port)], stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure(a: argparse.Namespace, variant: str, scenario: str, rps: float, workers: int,
            run: int) -> Row:
    if variant == "plain":
        with plain_server(a.ref_python, a.bench_dir, workers) as (url, pid):
            return _driven(a, variant, scenario, run, url, "json", rps, pid)
    path, proto = PATHS["v2" if variant == "v2" else "v1"]
    root = a.before_root if variant == "v1-before" else a.root
    if root is None:
        raise SystemExit("v1-before needs --before-root")
    args = ["--keys", str(KEYS), "--batch-latency-ms", "0"]
    paths = [str(a.bench_dir), str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    with _sink_if(variant.startswith("v1-traced")) as endpoint:
        if endpoint is not None:
            args += ["--otlp-endpoint", endpoint]
        if variant == "v1-traced-10":
            args += ["--otlp-sample", "0.1"]
        with running_server(workers, "batchfn:batchstring_blocking", args,
                            env={"PYTHONPATH": os.pathsep.join(paths)}, cwd=root) as srv:
            return _driven(a, variant, scenario, run, srv.url + path, proto, rps,
                           door_pid(srv), srv.pid)


@contextmanager
def _sink_if(wanted: bool) -> Iterator[str | None]:
    """`otlp_sink`'s endpoint when `wanted`, else None."""
    if not wanted:
        yield None
        return
    with otlp_sink() as endpoint:
        yield endpoint


def _driven(a: argparse.Namespace, variant: str, scenario: str, run: int, url: str,
            proto: str, rps: float, door: int, top: int | None = None) -> Row:
    """Warm `url`, then the measured run; its row."""
    generate(a.ref_python, a.bench_dir, url, rps, a.warmup_s, 0.5, a.seed + 1, proto)
    top = door if top is None else top
    cpu0, all0 = cpu_seconds(door), cpu_seconds(top) + cpu_seconds(top, children=True)
    result = generate(a.ref_python, a.bench_dir, url, rps, a.duration, a.warmup, a.seed,
                      proto)
    cpu = cpu_seconds(door) - cpu0
    every = cpu_seconds(top) + cpu_seconds(top, children=True) - all0
    lat = result["lat_ms"]
    assert isinstance(lat, dict)
    n = {k: int(v) for k, v in result.items() if isinstance(v, int | float)}
    sent = max(1, n["total_sent_incl_warmup"])
    return Row(scenario, variant, run, float(lat["p50"] or math.nan),
               float(lat["p95"] or math.nan), float(lat["p99"] or math.nan), n["sent"],
               n["ok"], n["wrong"] + n["errors"] + n["timeouts"], cpu * 1e3 / sent,
               every * 1e3 / sent, bool(result["generator_fell_behind"]))


HEADER = (f"{'scenario':<9} {'variant':<10} {'run':>3} {'p50':>6} {'p95':>6} {'p99':>6} "
          f"{'sent':>6} {'ok':>6} {'bad':>4} {'cpu ms/req':>10} {'all cpu':>8} gen")


def format_row(r: Row) -> str:
    return (f"{r.scenario:<9} {r.variant:<10} {r.run:>3} {r.p50_ms:>6.1f} {r.p95_ms:>6.1f} "
            f"{r.p99_ms:>6.1f} {r.sent:>6} {r.ok:>6} {r.bad:>4} {r.cpu_ms_per_req:>10.3f} "
            f"{r.all_cpu_ms_per_req:>8.3f} {'BEHIND' if r.generator_behind else 'ok'}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_protocols",
                                description=__doc__.split("\n\n")[0])
    generator_arguments(p, ("800@1", "3000@4"))
    p.add_argument("--variants", nargs="+", choices=VARIANTS,
                   default=["plain", "v1", "v2", "v1-traced"])
    p.add_argument("--before-root", type=Path, help="v1-before: the checkout of the build before")
    a = p.parse_args(argv)
    print(f"open loop, Poisson, seed {a.seed}, {a.duration:g} s per run; ms from the scheduled "
          "send; cpu: ms per request of the door's process; all: with its workers and "
          "children", flush=True)
    print(HEADER, flush=True)
    rows: list[Row] = []
    for spec, rps, workers in scenarios(a.rates):
        for run in range(1, a.runs + 1):
            for variant in a.variants:
                rows.append(measure(a, variant, spec, rps, workers, run))
                print(format_row(rows[-1]), flush=True)
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.bad for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
