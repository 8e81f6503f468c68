"""The start-time benchmark, briefly, against real `sim` worker processes: every kind of
start comes up as the kind it is measured as, and the parked cap holds."""

from __future__ import annotations

from pathlib import Path

import anyio
import orjson
import pytest

from loadtest.start_times import main


def test_each_start_reports_its_kind_and_the_parked_cap_keeps_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "starts.json"
    assert anyio.run(main, ["--models", "sim", "--starts", "2", "--json", str(out)]) == 0
    figures = orjson.loads(out.read_bytes())
    rows = {r["kind"]: r for r in figures["rows"]}
    assert {k: (r["expected"], r["mismatches"], len(r["seconds"])) for k, r in rows.items()} \
        == {"spawn": ("spawn", 0, 2), "fork": ("fork", 0, 2), "wake": ("wake", 0, 2),
            "switch spawn": ("spawn", 0, 2), "switch fork": ("fork", 0, 2)}
    assert all(s > 0 for r in rows.values() for s in r["seconds"])
    [cap] = figures["caps"]
    assert cap["kept"] == 2
    assert [version for version, _ in cap["parked"]] == ["sim@b", "sim@c"]
    assert cap["given_up_state"] in ("gone", "Z")
    [memory] = figures["memory"]
    assert 0 < memory["pss_mib"] <= memory["rss_mib"]
    printed = capsys.readouterr().out
    for kind in ("spawn", "fork", "wake"):
        assert any(line.startswith(f"sim      {kind} ") for line in printed.splitlines())
    assert "2 parked" in printed
