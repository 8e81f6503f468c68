"""The dispatch benchmark, briefly, against real `sim` worker processes."""

from __future__ import annotations

from pathlib import Path

import anyio
import orjson
import pytest

from loadtest.bench_dispatch import main, measure


@pytest.mark.e2e
def test_500_items_per_second_on_two_workers_are_all_answered_rightly() -> None:
    row = anyio.run(measure, 500.0, 2, True, 2.0)
    assert row.items > 500 and row.ok == row.items
    assert row.wrong == row.errors == row.lost == 0
    assert row.p50_ms >= 100.0  # the contract's floor: no answer sooner than one batch
    assert row.mean_fill > 1
    assert sum(row.flushes.values()) > 0


@pytest.mark.e2e
def test_the_command_writes_one_row_per_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    argv = ["--rates", "300", "--workers", "2", "--duration", "1", "--idle-trigger", "both",
            "--json", str(out), "--plot", str(tmp_path / "plot.png")]
    assert main(argv) == 0
    rows = orjson.loads(out.read_bytes())
    assert [r["idle_trigger"] for r in rows] == [True, False]
    assert "plot" in capsys.readouterr().out  # written, or why not
