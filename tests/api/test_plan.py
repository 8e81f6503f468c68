"""The capacity planner: the floor formula, the search over the real core in event time,
and the command line's contract (one parseable `gpus:` line, exit 1 unreachable, 2 bad)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from api.plan import (
    BUSY,
    CORE_CPU_MS,
    GATEWAY_CPU_MS,
    floor_gpus,
    front_door,
    main,
    plan,
    poisson,
    simulate,
)
from batcher import FlushPolicy

BATCHGATE = str(Path(sys.executable).parent / "batchgate")  # the installed console script


def test_floor_is_items_per_second_over_one_gpus_capacity() -> None:
    assert floor_gpus(10_000, 100, 100) == 10
    assert floor_gpus(100, 100, 100) == 1
    assert floor_gpus(1_001, 100, 100) == 2
    assert floor_gpus(1_000, 50, 100, inputs=3) == 6
    assert floor_gpus(3_000, 100, 200) == 6


def test_no_request_beats_one_batch_latency_and_idle_workers_add_no_wait() -> None:
    arrivals = poisson(100, 5.0, seed=2)
    one = simulate(arrivals, 1, FlushPolicy(), 0.1, 1, 5.0)
    many = simulate(arrivals, 30, FlushPolicy(), 0.1, 1, 5.0)
    assert one.p50 >= 0.1 and one.p95 <= 0.1 + 0.05 + 0.1  # max_wait, then one batch ahead
    assert many.p50 == pytest.approx(0.1) and many.p95 == pytest.approx(0.1)


def test_a_load_equal_to_capacity_is_never_accepted() -> None:
    result = plan(1_000, duration_s=3)
    assert result.floor == 1 and result.tried[0].saturated
    assert result.chosen is not None and result.chosen.workers == 2


def test_100_rps_needs_at_most_two_gpus() -> None:
    result = plan(100, duration_s=5)
    assert result.gpus is not None and result.floor <= result.gpus <= 2


def test_the_count_never_falls_as_the_load_grows_nor_drops_below_the_floor() -> None:
    results = [plan(rps, duration_s=2) for rps in (300, 1_500, 3_000, 5_500)]
    counts = [r.chosen.workers for r in results if r.chosen is not None]
    assert len(counts) == 4 and counts == sorted(counts)
    assert all(n >= r.floor for n, r in zip(counts, results, strict=True))


def test_spares_are_added_and_priced_per_million_items() -> None:
    result = plan(1_000, spare_gpus=2, gpu_hour_cost=3.6, duration_s=3)
    assert result.chosen is not None and result.gpus == result.chosen.workers + 2
    assert result.cost_per_million == pytest.approx(result.gpus * 3.6 / (1_000 * 3600) * 1e6)


def test_cli_prints_one_parseable_gpus_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rps", "500", "--spare-gpus", "1", "--gpu-hour-cost", "2",
                 "--duration-s", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if re.fullmatch(r"gpus: \d+", line)]) == 1
    fields = dict(line.split(": ", 1) for line in out if not line.startswith("#"))
    assert int(fields["gpus"]) == int(fields["chosen"]) + 1 >= int(fields["floor"]) + 1
    for key in ("simulated_p95_ms", "simulated_p50_ms", "mean_fill", "cost_per_million"):
        float(fields[key])


def test_a_target_below_the_batch_latency_is_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--rps", "100", "--p95-ms", "50"]) == 1
    out, err = capsys.readouterr()
    assert "gpus:" not in out and "unreachable" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [[], ["--rps", "0"], ["--rps", "x"], ["--rps", "10", "--max-batch", "101"],
     ["--rps", "10", "--batch-latency-ms", "0"], ["--rps", "10", "--inputs-per-request", "0"],
     ["--rps", "10", "--spare-gpus", "-1"], ["--rps", "10", "--p95-ms", "-1"]],
)
def test_a_bad_value_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "error" in err


BLOCKER = '''
import importlib.abc, sys
DEV_ONLY = {"trio", "hypothesis", "locust", "pytest", "httpx", "loadtest"}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in DEV_ONLY:
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
'''


def test_batchgate_plan_runs_without_the_dev_packages_or_the_load_tests(
    tmp_path: Path,
) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([BATCHGATE, "plan", "--rps", "1000"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^gpus: \d+$", done.stdout, re.MULTILINE)
    blocked = subprocess.run([sys.executable, "-c", "import trio"], env=env, capture_output=True)
    assert blocked.returncode == 1  # the blocker is really in place


def test_the_old_module_path_still_runs_the_planner() -> None:
    import loadtest.plan

    assert loadtest.plan.main is main


def test_the_front_door_is_one_process_at_low_load_and_a_cell_at_10000_rps() -> None:
    low = front_door(1000)
    assert (low.gateways, low.cores) == (1, 1)
    high = front_door(10_000)
    # Each gateway is planned at BUSY of a core: together they carry every request's HTTP.
    assert high.gateways >= 10_000 * GATEWAY_CPU_MS / 1000 / BUSY
    assert high.cores == high.gateways + 1
    assert high.core_load == pytest.approx(10_000 * CORE_CPU_MS / 1000)  # one process: one core
    assert front_door(20_000).gateways > high.gateways


def test_plan_prints_the_front_door(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rps", "10000", "--duration-s", "2"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines()
                 if not line.startswith("#"))
    assert int(lines["gateways"]) == front_door(10_000).gateways
    assert int(lines["front_door_cores"]) == int(lines["gateways"]) + 1
