"""The door-limits benchmark runs and reports both protocols."""

from __future__ import annotations

import re

import pytest

from loadtest.bench_guard import main


def test_it_prints_a_figure_per_protocol_per_round(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "200", "--rounds", "2"]) == 0
    rounds = re.findall(r"plain (\d+\.\d+) us/req, guarded (\d+\.\d+) us/req",
                        capsys.readouterr().out)
    assert len(rounds) == 2 and all(float(a) > 0 and float(b) > 0 for a, b in rounds)
