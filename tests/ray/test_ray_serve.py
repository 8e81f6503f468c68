"""`batchgate serve --pool ray` on the real cluster, through real HTTP: steady load, an actor
killed mid-batch, a whole worker node lost and one added back, and the real model."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from batchgate_client import Client
from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult
from loadtest.server import (
    ServerError,
    fetch_metrics,
    metric,
    running_server,
    start_server,
)
from tests.e2e.helpers import patient_keys
from tests.e2e.test_minilm import CASES
from tests.ray.lab import Lab, Worker, in_state, kill_actor, up, wait_workers

pytestmark = pytest.mark.e2e
PAID = (TrafficClass.bearer("paid", "paid-demo-key"),)
SLOW_BATCHES = ["--batch-latency-ms", "300"]  # a batch long enough to be caught running


@contextlib.contextmanager
def load_beside(url: str, rps: float, seconds: float) -> Iterator[list[ProbeResult]]:
    """Open-loop load in a thread and event loop of its own, never held up by the cluster's
    steps in this (the main) thread: Ray adds and removes nodes only from there, and a step
    that blocks for seconds would otherwise stall the load's sends and reads, and its
    timeouts (counted from each request's scheduled time) would blame the server. Every
    answer is checked (each input unique, reversed); the result is in the list at exit."""
    out: list[ProbeResult] = []

    def load() -> None:
        cfg = ProbeConfig(url, rps, seconds, classes=PAID, timeout_s=10)
        out.append(anyio.run(run_probe, cfg))

    thread = threading.Thread(target=load, name="load")
    thread.start()
    try:
        yield out
    finally:
        thread.join(seconds + 30)


def steps(url: str, condition: Callable[[list[Worker]], bool]) -> list[Worker]:
    """`wait_workers`, from the main thread."""
    return anyio.run(wait_workers, url, condition)


def assert_all_answered(results: list[ProbeResult]) -> None:
    (r,) = results
    assert r.sent > 0 and r.shed == 0
    assert (r.ok, r.wrong, r.lost, dict(r.statuses)) == (r.sent, 0, 0, {200: r.sent}), r.errors


def test_300_rps_on_four_actors_on_two_nodes_all_answered_correctly(
    lab: Lab, tmp_path: Path
) -> None:
    with running_server(4, "sim", [*lab.serve_args(), *patient_keys(tmp_path)]) as srv:
        workers = steps(srv.url, lambda ws: len(up(ws)) == 4)
        assert sorted(w["node"] for w in workers) == sorted(lab.worker_nodes() * 2)
        with load_beside(srv.url, 300, 8) as results:
            pass
        assert_all_answered(results)
        assert metric(fetch_metrics(srv.url), "batchgate_worker_crashes_total") == 0


def test_ray_kill_of_a_busy_actor_loses_nothing_and_the_pool_comes_back_to_four(
    lab: Lab, tmp_path: Path
) -> None:
    # In a cell of two gateways: the pool, and Ray with it, lives in the core process.
    args = [*lab.serve_args(), *patient_keys(tmp_path), *SLOW_BATCHES, "--gateways", "2"]
    with running_server(4, "sim", args) as srv:
        steps(srv.url, lambda ws: len(up(ws)) == 4)
        with load_beside(srv.url, 300, 8) as results:
            (busy, *_) = in_state(steps(srv.url, lambda ws: bool(in_state(ws, "busy"))), "busy")
            kill_actor(busy["pid"])
            after = steps(
                srv.url, lambda ws: len(up(ws)) == 4 and busy["id"] not in {w["id"] for w in ws})
        assert_all_answered(results)
        assert [w["restarts"] for w in after if w["slot"] == busy["slot"]] == [1]
        m = fetch_metrics(srv.url)
        assert metric(m, "batchgate_worker_crashes_total") == 1
        assert metric(m, "batchgate_batch_reroutes_total") >= 1


def test_a_lost_node_runs_the_pool_on_two_until_a_node_joins_and_loses_nothing(
    lab: Lab, tmp_path: Path
) -> None:
    args = [*lab.serve_args(), *patient_keys(tmp_path), *SLOW_BATCHES]
    with running_server(4, "sim", args) as srv:
        steps(srv.url, lambda ws: len(up(ws)) == 4)
        with load_beside(srv.url, 300, 15) as results:
            (busy, *_) = in_state(steps(srv.url, lambda ws: bool(in_state(ws, "busy"))), "busy")
            lost = busy["node"]
            lab.remove_node(lost)
            two = steps(srv.url, lambda ws: len(up(ws)) == 2
                        and len(in_state(ws, "pending")) == 2)
            assert lost not in {w["node"] for w in up(two)}
            wait_batches(srv.url, batches_run(srv.url) + 10)  # served on two meanwhile
            still = steps(srv.url, lambda ws: True)
            assert (len(up(still)), len(in_state(still, "pending"))) == (2, 2)
            joined = lab.add_node()
            four = steps(srv.url, lambda ws: len(up(ws)) == 4)
        assert_all_answered(results)
        assert sorted(w["node"] for w in up(four)).count(joined) == 2
        m = fetch_metrics(srv.url)
        assert metric(m, "batchgate_worker_crashes_total") == 2
        assert metric(m, "batchgate_batch_reroutes_total") >= 1


def batches_run(url: str) -> float:
    """The server's batch counter."""
    return metric(fetch_metrics(url), "batchgate_batch_size_count")


def wait_batches(url: str, count: float, within: float = 30.0) -> None:
    """Poll the server's batch counter (another process) until it reaches `count`."""
    deadline = time.monotonic() + within
    while batches_run(url) < count:
        assert time.monotonic() < deadline, f"fewer than {count} batches in {within} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_the_real_model_on_ray_labels_topical_sentences_over_http(lab: Lab) -> None:
    with (running_server(1, "minilm", lab.serve_args(), ready_timeout_s=240) as srv,
          Client(srv.url, timeout=120) as client):
        assert client.batchstring(list(CASES)) == list(CASES.values())


def test_a_head_that_is_not_there_fails_the_start_in_seconds() -> None:
    with pytest.raises(ServerError, match="cannot reach the Ray cluster") as failed:
        start_server(1, "sim", ["--pool", "ray", "--ray-address", "127.0.0.1:1"],
                     ready_timeout_s=60)
    failed.value.log_path.unlink()  # the failure it was meant to show
