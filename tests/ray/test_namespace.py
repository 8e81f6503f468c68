"""The runner: every other test here runs in a network namespace this test makes, where
loopback is the only interface (Ray would otherwise register on the host's address)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from loadtest.netns import loopback_only, netns_argv, netns_unavailable

ROOT = Path(__file__).parents[2]
LIMIT_S = 420  # the whole run takes about four and a half minutes on two busy cores
INSIDE = "inside a namespace"  # the user property that says what ran there


def test_the_ray_tests_pass_in_a_loopback_only_network_namespace(
    record_property: Callable[[str, object], None],
) -> None:
    if loopback_only():
        pytest.skip("already in such a namespace: the tests beside this one run here")
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")
    if reason := netns_unavailable():
        pytest.skip(reason)
    here = Path(__file__)
    argv = [sys.executable, "-m", "pytest", str(here.parent), f"--ignore={here}", "-p",
            "no:cacheprovider", "-q", "-ra", "--durations=0"]
    proc = subprocess.Popen(netns_argv(argv), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, _ = proc.communicate()
    print(out)
    told = f"tests/ray inside a loopback-only network namespace: {summary(out)}"
    record_property(INSIDE, told)  # tests/conftest.py prints it at the end of the run
    assert proc.returncode == 0, f"{told}\n{out[-6000:]}"
    counts = outcomes(out)
    others = set(counts) - {"passed", "warning", "warnings"}
    assert counts.get("passed", 0) > 0 and not others, told  # none skipped quietly


def outcomes(out: str) -> dict[str, int]:
    """The counts on the last line of a `pytest -q` run ("2 failed, 33 passed in 95.1s"):
    {"failed": 2, "passed": 33}."""
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return {word: int(n) for n, word in re.findall(r"(\d+) ([a-z]+)", last.split(" in ")[0])}


def summary(out: str) -> str:
    """What the inner run ended with: its counts, each failure's id, or why there are none
    (killed at `LIMIT_S`)."""
    counts = outcomes(out)
    if not counts:
        return f"no summary (killed after {LIMIT_S} s?)"
    failed = [line.split(" - ")[0] for line in out.splitlines()
              if line.startswith(("FAILED ", "ERROR "))]
    return ", ".join(f"{n} {word}" for word, n in counts.items()) + \
        "".join(f"\n  {line}" for line in failed)


def kill_session(sid: int) -> None:
    """Kill every process of session `sid`: the run and the Ray daemons and workers it
    started (Ray gives its workers process groups of their own, but not sessions)."""
    import psutil

    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == sid:
                proc.kill()
