"""The runner: every other test here runs in a network namespace this test makes, where
loopback is the only interface (Ray would otherwise register on the host's address)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.netns import loopback_only, netns_argv, netns_unavailable

ROOT = Path(__file__).parents[2]
LIMIT_S = 420  # the whole run takes about two minutes


def test_the_ray_tests_pass_in_a_loopback_only_network_namespace() -> None:
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
    assert proc.returncode == 0, out[-6000:]
    summary = out.splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary  # none quietly


def kill_session(sid: int) -> None:
    """Kill every process of session `sid`: the run and the Ray daemons and workers it
    started (Ray gives its workers process groups of their own, but not sessions)."""
    import psutil

    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == sid:
                proc.kill()
