"""What guard stages cost over HTTP, beside the bound the policy itself gives.

    python -m loadtest.bench_guards [--duration 20] [--rate 800] [--runs 1] [--bench-dir DIR]
        [--root DIR] [--rows NAME ...] [--json OUT]

Each row of `loadtest.guard_rows` (the model alone, a pre guard in sequence, in parallel,
pre and post, and half the inputs refused) is served by a real `batchgate serve --workers 4`
with a models file of that row (the model `batchfn:batchstring_blocking` as
`loadtest.bench_reference` serves it, the guard `tests.models_guards:allow_all` or
`loadtest.guard_models:refuse_odd`, every batch padded to 100 ms), and driven by the shared
open-loop generator (`../shared/bench/loadgen.py`: Poisson, fixed seed, latency from the
scheduled send). Beside it: the row's bound, the same catalogue on the real core in virtual
time over contract workers (no HTTP, no processes, no clock but the policy's), and for the
one-stage row the plain pull batcher on the model's 2 workers, in the same run. Fill is the
mean batch size of each model over the measured window, read from `batchgate_batch_size`.
With `--runs N` each row (and the plain batcher beside it) is measured N times, one after
the other, and the row shows the median of the runs' quantiles, each run's P50 after it: on
a small shared machine one run's P50 moves by several milliseconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest.bench_reference import generate, measure_plain
from loadtest.guard_rows import (
    EACH,
    GUARD,
    KEYS,
    MODEL,
    ROWS,
    Row,
    bound,
    catalogue_toml,
    quantiles_ms,
)
from loadtest.server import fetch_metrics, running_server

ROOT = Path(__file__).resolve().parents[1]
MODEL_SPEC = "batchfn:batchstring_blocking"  # sleeps 100 ms, answers each input reversed
ALLOW, REFUSE = "tests.models_guards:allow_all", "loadtest.guard_models:refuse_odd"
FILL = "batchgate_batch_size"


@dataclass(slots=True)
class Figures:
    row: str
    p50: float = math.nan  # batchgate, ms from the scheduled send (answered 200 only)
    p95: float = math.nan
    p99: float = math.nan
    sent: int = 0
    ok: int = 0
    bad: int = 0  # wrong answers, errors other than refusals, timeouts
    refused: int = 0  # 422 answers
    behind: bool = False  # the generator fell behind its schedule
    bound_p50: float = math.nan
    bound_p95: float = math.nan
    plain_p50: float = math.nan
    plain_p95: float = math.nan
    fill: dict[str, float] = field(default_factory=dict)  # batchgate: model -> mean batch
    bound_fill: dict[str, float] = field(default_factory=dict)
    p50_runs: list[float] = field(default_factory=list)  # each run's, in order (--runs)
    plain_p50_runs: list[float] = field(default_factory=list)

    @property
    def over_bound(self) -> float:
        return self.p50 - self.bound_p50


def fills(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Each model's mean batch size over the observations gained between two scrapes."""
    sums: dict[str, list[float]] = {}
    for key, value in after.items():
        for part, at in (("_sum{", 0), ("_count{", 1)):
            if key.startswith(FILL + part) and 'model="' in key:
                model = key.split('model="', 1)[1].split('"', 1)[0]
                sums.setdefault(model, [0.0, 0.0])[at] += value - before.get(key, 0.0)
    return {m: s / n for m, (s, n) in sums.items() if n}


def measure(a: argparse.Namespace, row: Row, folder: Path, out: Figures) -> None:
    """`row` over HTTP: its latencies, answers and fill go into `out`."""
    models = folder / f"models-{row.name.replace(' ', '-').replace('+', '_')}.toml"
    guard = REFUSE if row.refuse_half else ALLOW
    models.write_text(catalogue_toml(row, MODEL_SPEC, guard))
    args = ["--models", str(models), "--keys", str(KEYS), "--batch-latency-ms", "100"]
    paths = [str(a.bench_dir), str(a.root), *filter(None, [os.environ.get("PYTHONPATH")])]
    with running_server(2 * EACH, "sim", args, env={"PYTHONPATH": os.pathsep.join(paths)},
                        cwd=a.root) as srv:
        url = srv.url + "/v1/batchstring"
        generate(a.ref_python, a.bench_dir, url, a.rate, a.warmup_s, 0.5, a.seed + 1)  # warm
        before = fetch_metrics(srv.url)
        result = generate(a.ref_python, a.bench_dir, url, a.rate, a.duration, a.warmup,
                          a.seed)
        after = fetch_metrics(srv.url)
    lat = result["lat_ms"]
    assert isinstance(lat, dict)
    kinds = result.get("error_kinds") or {}
    assert isinstance(kinds, dict)
    out.p50, out.p95, out.p99 = (float(lat[q] or math.nan) for q in ("p50", "p95", "p99"))
    n = {k: int(v) for k, v in result.items() if isinstance(v, int | float)}
    out.sent, out.ok, out.refused = n["sent"], n["ok"], int(kinds.get("http_422", 0))
    out.bad = n["wrong"] + n["errors"] + n["timeouts"] - out.refused
    out.behind = bool(result["generator_fell_behind"])
    out.fill = fills(before, after)


def merged(runs: Sequence[Figures]) -> Figures:
    """The runs of one row as one: the median of their quantiles and fills, their counts
    summed, each run's P50 kept."""
    out = Figures(runs[0].row, sent=sum(r.sent for r in runs), ok=sum(r.ok for r in runs),
                  bad=sum(r.bad for r in runs), refused=sum(r.refused for r in runs),
                  behind=any(r.behind for r in runs))
    out.p50, out.p95, out.p99 = (statistics.median(getattr(r, q) for r in runs)
                                 for q in ("p50", "p95", "p99"))
    out.fill = {m: statistics.median(r.fill.get(m, math.nan) for r in runs)
                for m in runs[0].fill}
    out.p50_runs = [r.p50 for r in runs]
    return out


def _f(x: float, width: int = 6) -> str:
    return f"{'-':>{width}}" if math.isnan(x) else f"{x:>{width}.1f}"


HEADER = (f"{'row':<15} {'p50':>6} {'p95':>6} {'p99':>6} {'bnd50':>6} {'bnd95':>6} "
          f"{'pln50':>6} {'pln95':>6} {'p50-bnd':>7} {'ok':>6} {'422':>5} {'bad':>4} "
          f"{'fill m/g':>11} {'bnd fill m/g':>12} gen")


def format_row(f: Figures) -> str:
    fill = f"{f.fill.get(MODEL, math.nan):.1f}/{f.fill.get(GUARD, math.nan):.1f}"
    bfill = f"{f.bound_fill.get(MODEL, math.nan):.1f}/{f.bound_fill.get(GUARD, math.nan):.1f}"
    return (f"{f.row:<15} {_f(f.p50)} {_f(f.p95)} {_f(f.p99)} {_f(f.bound_p50)} "
            f"{_f(f.bound_p95)} {_f(f.plain_p50)} {_f(f.plain_p95)} {_f(f.over_bound, 7)} "
            f"{f.ok:>6} {f.refused:>5} {f.bad:>4} {fill:>11} {bfill:>12} "
            f"{'BEHIND' if f.behind else 'ok'}" + _runs(f))


def _runs(f: Figures) -> str:
    if len(f.p50_runs) < 2:
        return ""
    plain = f" pln50 {'/'.join(f'{x:.1f}' for x in f.plain_p50_runs)}" \
        if f.plain_p50_runs else ""
    return f"  p50 {'/'.join(f'{x:.1f}' for x in f.p50_runs)}{plain}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_guards",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=800.0, help="requests/s, one input each")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per row")
    p.add_argument("--warmup", type=float, default=3.0, help="generator's own warm-up")
    p.add_argument("--warmup-s", type=float, default=3.0, help="a separate warm-up run first")
    p.add_argument("--seed", type=int, default=1800)
    p.add_argument("--runs", type=int, default=1, help="runs per row (median shown)")
    p.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    p.add_argument("--ref-python", default=str(Path.home() / ".cache/refbench/bin/python"))
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the batchgate checkout to serve (e.g. a worktree of an older commit)")
    p.add_argument("--rows", nargs="+", choices=[r.name for r in ROWS], metavar="ROW",
                   default=[r.name for r in ROWS], help="rows to run (default: all)")
    p.add_argument("--bound-only", action="store_true", help="the bounds alone, no HTTP")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the rows as JSON")
    a = p.parse_args(argv)
    print(f"{a.rate:g} RPS open loop, Poisson, seed {a.seed}, {a.duration:g} s per row; ms from "
          f"the scheduled send; {MODEL} and guard {GUARD} on {EACH} workers each, 100 ms "
          "batches; bnd: the policy's bound (virtual time); pln: the plain pull batcher on "
          f"{EACH} workers; fill m/g: mean batch of {MODEL}/{GUARD}", flush=True)
    print(HEADER, flush=True)
    rows: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="bench-guards-") as tmp:
        for row in (r for r in ROWS if r.name in a.rows):
            runs, plains = [], []
            for _ in range(0 if a.bound_only else a.runs):
                measure(a, row, Path(tmp), run := Figures(row.name))
                runs.append(run)
                if not (row.pre or row.post):
                    plains.append(measure_plain(a, row.name, a.rate, EACH, 1))
            out = merged(runs) if runs else Figures(row.name)
            sim = bound(row, a.rate, a.duration, a.warmup, a.seed)
            out.bound_p50, out.bound_p95 = quantiles_ms(sim)
            out.bound_fill = dict(sim.fill)
            if plains:
                out.plain_p50 = statistics.median(x.p50_ms for x in plains)
                out.plain_p95 = statistics.median(x.p95_ms for x in plains)
                out.plain_p50_runs = [x.p50_ms for x in plains]
            rows.append(out)
            print(format_row(out), flush=True)
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.bad for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
