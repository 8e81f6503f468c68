"""Long inputs on real workers that take longer on them (`tests.models:slowlong`, 8 s per MB
of input): a batch's characters are capped, and a request whose own inputs cannot be
answered before its deadline is refused before any of them holds a worker (issue 28,
item 6). What it does to latency is measured by `loadtest/hostile_long.py`."""

from __future__ import annotations

import time

import httpx
import pytest

from loadtest.server import fetch_metrics, metric, running_server
from tests.e2e.helpers import EXAMPLE_KEYS, PAID

pytestmark = [pytest.mark.e2e]
MODEL = "tests.models:slowlong"
LONG = "x" * 10_000


def batches(url: str, items: int) -> float:
    """The batches run once their items reach `items` (polled, bounded: the server counts a
    batch just after its answers go out)."""
    deadline = time.monotonic() + 10.0
    while True:
        m = fetch_metrics(url)
        if metric(m, "batchgate_batch_size_sum") >= items or time.monotonic() > deadline:
            assert metric(m, "batchgate_batch_size_sum") == items
            return metric(m, "batchgate_batch_size_count")
        time.sleep(0.01)  # another process: poll it


def test_a_free_request_too_long_for_its_deadline_is_refused_before_it_runs() -> None:
    args = ["--keys", str(EXAMPLE_KEYS), "--model", MODEL]
    with running_server(workers=2, args=args) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        for k in range(6):  # short batches: what a batch costs whatever it holds
            answer = client.post("/v1/batchstring", json={"input": f"short-{k}"}, headers=PAID)
            assert answer.status_code == 200, answer.text
        # Long ones: what characters cost (6 inputs, in slices of 2 while it is unknown).
        answer = client.post("/v1/batchstring", json={"inputs": [LONG] * 6}, headers=PAID)
        assert answer.status_code == 200 and answer.json()["outputs"] == [LONG] * 6
        # 100 x 10,000 characters take 8 s of a worker; the free tier's deadline is 2 s.
        refused = client.post("/v1/batchstring", json={"inputs": [LONG] * 100})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "deadline_unreachable"
        assert "retry-after" in refused.headers
        small = client.post("/v1/batchstring", json={"inputs": [LONG] * 2})
        assert small.status_code == 200, small.text  # what fits its deadline still runs
        batches(srv.url, 6 + 6 + 2)  # and none of the refused request's inputs ever ran


def test_max_batch_chars_caps_each_batch() -> None:
    args = ["--keys", str(EXAMPLE_KEYS), "--model", MODEL, "--max-batch-chars", "25000"]
    with running_server(workers=1, args=args) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        answer = client.post("/v1/batchstring", json={"inputs": [LONG] * 10}, headers=PAID)
        assert answer.status_code == 200 and answer.json()["outputs"] == [LONG] * 10
        assert batches(srv.url, 10) == 5  # two inputs a batch: 20,000 characters
