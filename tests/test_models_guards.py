"""The suite's test guards answer the verdicts their markers promise, one per input, in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import models_guards as g

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ["a", "BLOCKME b", "c LEAK", "the secret", ""]


def test_refuse_marker_refuses_only_the_marked_inputs() -> None:
    assert g.refuse_marker(INPUTS) == ["allow", "refuse:marker", "allow", "allow", "allow"]


def test_the_logged_guard_logs_each_input_with_its_pid_then_judges_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "guard.log"
    monkeypatch.setenv(g.GUARD_LOG_VARIABLE, str(log))
    assert g.logged_refuse_marker(INPUTS) == g.refuse_marker(INPUTS)
    assert log.read_text().splitlines() == [f"{os.getpid()}\t{s}" for s in INPUTS]


def test_allow_all_hang_and_crash_allow_unmarked_inputs() -> None:
    for guard in (g.allow_all, g.hang, g.crash):
        assert guard(INPUTS) == ["allow"] * len(INPUTS)


def test_bad_verdict_answers_one_non_verdict_string_per_input() -> None:
    assert g.bad_verdict(INPUTS) == ["maybe"] * len(INPUTS)


def test_the_leak_model_leaks_for_secrets_and_the_post_guard_catches_only_that() -> None:
    outputs = g.leak_model(["hi", "my secret"])
    assert outputs == ["ok:hi", "LEAK:my secret"]
    assert g.refuse_output_marker(outputs) == ["allow", "refuse:leak"]


def test_crash_ends_its_process_with_status_1() -> None:
    code = "from tests.models_guards import crash; crash(['x CRASH'])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 1
