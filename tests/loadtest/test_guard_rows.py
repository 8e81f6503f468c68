"""The guard-stage benchmark's bounds, in virtual time (seeded: the same run gives the same
figures): the real core passes an input through its guard and its model, one batch each,
and the model's batches hold only the inputs the guard allowed."""

from __future__ import annotations

import re

import pytest

from loadtest.bench_guards import main
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
