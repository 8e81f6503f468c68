"""The guard-stage benchmark's bounds, in virtual time (seeded: the same run gives the same
figures): the real core passes an input through its guard and its model, one batch each,
and the model's batches hold only the inputs the guard allowed."""

from __future__ import annotations

import re

import pytest

from loadtest.bench_guards import Figures, format_row, main, merged
from loadtest.guard_rows import GUARD, MODEL, ROWS, bound, catalogue_toml, quantiles_ms

ROW = {r.name: r for r in ROWS}


def test_a_sequential_guard_puts_the_median_between_two_and_three_batches() -> None:
    outcome = bound(ROW["pre+model seq"], 800.0, 3.0, warmup_s=1.0)
    p50, p95 = quantiles_ms(outcome)
    assert 200.0 < p50 < 300.0 and p50 <= p95
    t = outcome.tally()
    assert t.answered > 2000 and not t.failed and not t.refused and not t.unanswered
    assert quantiles_ms(bound(ROW["pre+model seq"], 800.0, 3.0, warmup_s=1.0)) == (p50, p95)


def test_in_parallel_the_guard_hides_behind_the_model() -> None:
    alone = quantiles_ms(bound(ROW["model alone"], 800.0, 3.0, warmup_s=1.0))
    parallel = quantiles_ms(bound(ROW["pre+model par"], 800.0, 3.0, warmup_s=1.0))
    assert parallel[0] < 200.0 and abs(parallel[0] - alone[0]) < 10.0


def test_refused_inputs_take_no_place_in_the_models_batches() -> None:
    outcome = bound(ROW["half refused"], 800.0, 3.0, warmup_s=1.0)
    t = outcome.tally()
    assert t.failed["Refused"] == pytest.approx(t.offered / 2, abs=1)
    assert 0.4 < outcome.fill[MODEL] / outcome.fill[GUARD] < 0.6


def test_the_models_file_of_a_row_names_its_guards() -> None:
    text = catalogue_toml(ROW["pre+model+post"], "sim", "tests.models_guards:allow_all")
    assert 'pre = ["safety"]' in text and 'post = ["safety"]' in text
    assert re.search(r'spec = "tests\.models_guards:allow_all"', text)


def test_the_bound_alone_prints_a_row_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bound-only", "--duration", "1", "--warmup", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines[2:]] == [r.name for r in ROWS]


def test_runs_of_a_row_show_their_median_and_each_p50() -> None:
    runs = [Figures("r", p50=p, p95=p + 50, p99=p + 90, sent=100, ok=99, bad=1,
                    fill={MODEL: f}) for p, f in ((130.0, 80.0), (120.0, 82.0), (150.0, 81.0))]
    out = merged(runs)
    assert (out.p50, out.p95, out.p99) == (130.0, 180.0, 220.0)
    assert (out.sent, out.ok, out.bad, out.fill) == (300, 297, 3, {MODEL: 81.0})
    assert out.p50_runs == [130.0, 120.0, 150.0]
    assert "p50 130.0/120.0/150.0" in format_row(out)
