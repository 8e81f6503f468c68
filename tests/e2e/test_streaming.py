"""Streamed answers end to end (issue 37), on real servers, in one process and in a cell:
the model logs every input it runs (`tests.models_logged`), so each test reads what reached
the model beside the events the client got."""

from __future__ import annotations

import functools
import json
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from loadtest.server import RunningServer, fetch_metrics, metric, running_server
from tests.e2e.helpers import EXAMPLE_KEYS, PAID, logged, metric_reaches
from tests.e2e.test_guards import LEAKS
from tests.e2e.test_guards import serve as guarded
from tests.models_logged import LOG_VARIABLE, expected

pytestmark = pytest.mark.e2e
SSE = {**PAID, "Accept": "text/event-stream", "X-Request-Timeout-Ms": "60000"}
NDJSON = {**PAID, "Accept": "application/x-ndjson", "X-Request-Timeout-Ms": "60000"}


def serve(tmp_path: Path, workers: int = 2) -> AbstractContextManager[RunningServer]:
    return running_server(workers, "tests.models_logged:batchstring",
                          ["--keys", str(EXAMPLE_KEYS)],
                          env={LOG_VARIABLE: str(tmp_path / "runs.log")})


def ran(tmp_path: Path) -> list[str]:
    log = tmp_path / "runs.log"
    return [line.partition("\t")[2] for line in log.read_text().splitlines()] \
        if log.exists() else []


def sse_events(text: str) -> list[tuple[int, dict[str, Any]]]:
    """(id, event) of each whole SSE event in `text`."""
    out = []
    for block in text.split("\n\n")[:-1]:  # the last is what follows the last whole event
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((int(fields["id"]), json.loads(fields["data"])))
    return out


def test_a_keyed_stream_resumed_after_a_drop_gets_each_index_once_and_each_input_ran_once(
        gateways: int, tmp_path: Path) -> None:
    texts = [f"in-{i}" for i in range(2000)]
    keyed = {**SSE, "Idempotency-Key": f"resume-{gateways}"}
    with serve(tmp_path) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        text = ""
        with client.stream("POST", "/v1/batchstring", json={"inputs": texts},
                           headers=keyed) as r:
            assert r.status_code == 200
            for chunk in r.iter_text():
                text += chunk
                if text.count("\n\n") >= 600:  # about 30%: the client drops
                    break
        first = sse_events(text)
        resumed = client.post("/v1/batchstring", json={"inputs": texts},
                              headers={**keyed, "Last-Event-ID": str(first[-1][0])})
    assert resumed.status_code == 200
    second = sse_events(resumed.text)
    ids = [n for n, _ in first + second]
    assert ids == list(range(2001))  # every event once, numbered in the order first sent
    events = [e for _, e in first + second]
    assert events[-1]["done"] is True and events[-1]["counts"] == {"outputs": 2000, "errors": 0}
    assert sorted(e["index"] for e in events[:-1]) == list(range(2000))
    assert all(e["output"] == expected(texts[e["index"]]) for e in events[:-1])
    assert sorted(ran(tmp_path)) == sorted(texts)  # each input ran once, over both


@pytest.mark.anyio
async def test_a_client_that_leaves_an_unkeyed_stream_withdraws_what_is_not_in_a_batch(
        gateways: int, tmp_path: Path) -> None:
    texts = [f"in-{i}" for i in range(10_000)]
    with serve(tmp_path) as server:
        received = 0
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client, \
                client.stream("POST", "/v1/batchstring", json={"inputs": texts},
                              headers=NDJSON) as r:
            assert r.status_code == 200
            async for _ in r.aiter_lines():
                received += 1
                if received >= 100:
                    break
        with anyio.fail_after(30):  # until nothing is queued and all that was sent ran
            while True:
                scraped = fetch_metrics(server.url)
                sent = metric(scraped, "batchgate_batch_size_sum", model="default",
                              version="v1")
                if metric(scraped, "batchgate_queue_depth", tier="paid") == 0 \
                        and sent == len(ran(tmp_path)):
                    break
                await anyio.sleep(0.05)  # another process: poll it
        runs = ran(tmp_path)
        assert len(runs) == len(set(runs))  # none twice
        # Its window (2 batches a worker) and the batches it had running: the rest never ran.
        assert received <= len(runs) <= received + 2 * 100 * 2 + 2 * 100
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            after = await client.post("/v1/batchstring", json={"input": "after"}, headers=PAID)
        assert after.json()["output"] == expected("after")


def test_refusals_before_a_stream_starts_are_plain_json(gateways: int, tmp_path: Path) -> None:
    with serve(tmp_path) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        too_many = client.post("/v1/batchstring", json={"inputs": ["a"] * 10_001}, headers=SSE)
        no_key = client.post("/v1/batchstring", json={"inputs": ["a"]},
                             headers={**SSE, "Last-Event-ID": "3"})
        unknown = client.post("/v1/batchstring", json={"inputs": ["a"]},
                              headers={**SSE, "Authorization": "Bearer nope"})
        client.post("/v1/batchstring", json={"input": "warm"}, headers=PAID)  # a batch timed
        too_soon = client.post("/v1/batchstring", json={"inputs": ["a"] * 10_000},
                               headers={**NDJSON, "X-Request-Timeout-Ms": "300"})
        one = client.post("/v1/batchstring", json={"input": "x"}, headers=NDJSON)
        anyio.run(functools.partial(metric_reaches, server.url, 1, "batchgate_streams_total",
                                    tier="paid", outcome="done"))  # once its end is written
        scraped = fetch_metrics(server.url)
    assert metric(scraped, "batchgate_stream_first_event_seconds_count", tier="paid") == 1
    codes = [(r.status_code, r.headers["content-type"], r.json()["error"]["code"])
             for r in (too_many, no_key, unknown, too_soon)]
    assert codes == [(422, "application/json", "too_many_inputs"),
                     (400, "application/json", "resume_needs_key"),
                     (401, "application/json", "unauthorized"),
                     (503, "application/json", "deadline_unreachable")]
    assert "retry-after" in too_soon.headers
    lines = [json.loads(line) for line in one.text.splitlines()]
    assert one.headers["content-type"] == "application/x-ndjson"
    assert lines[0] == {"index": 0, "output": expected("x")}
    assert lines[1]["done"] is True and lines[1]["counts"] == {"outputs": 1, "errors": 0}
    assert ran(tmp_path).count("a") == 0  # nothing refused ever ran


def test_a_streamed_guarded_request_gets_each_verdict_as_an_event_of_its_input(
        gateways: int, tmp_path: Path) -> None:
    with guarded(tmp_path) as server:
        r = httpx.post(f"{server.url}/v1/batchstring", headers=NDJSON, timeout=30,
                       json={"inputs": ["a", "BLOCKME b", LEAKS]})
    events = sorted((json.loads(line) for line in r.text.splitlines()),
                    key=lambda e: e.get("index", 3))
    assert events[:3] == [
        {"index": 0, "output": expected("a")},
        {"index": 1, "error": {"code": "refused", "message": "refused by the guard safety: "
                               "marker", "guard": "safety", "reason": "marker"}},
        {"index": 2, "error": {"code": "refused", "message": "refused by the guard leak: "
                               "leak", "guard": "leak", "reason": "leak"}}]
    assert events[3]["counts"] == {"outputs": 1, "errors": 2}
    assert expected(LEAKS) not in r.text  # a refused output never leaves
    assert sorted(ran(tmp_path)) == sorted(["a", LEAKS])  # the refused input never ran


def test_a_stream_whose_client_left_is_no_longer_ahead_of_the_streams_that_start(
        gateways: int) -> None:
    long = {**NDJSON, "X-Request-Timeout-Ms": "6000"}  # 10,000 inputs: 5 s on 2 workers
    texts = [f"s-{i}" for i in range(10_000)]
    with running_server(2, "sim", ["--keys", str(EXAMPLE_KEYS)]) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("POST", "/v1/batchstring", json={"inputs": texts},
                           headers=long) as first:
            assert first.status_code == 200
            # While it runs, another would wait for the ~10,000 inputs it has yet to send.
            ahead = client.post("/v1/batchstring", json={"inputs": texts}, headers=long)
        assert ahead.status_code == 503
        assert ahead.json()["error"]["code"] == "deadline_unreachable"
        codes = []
        until = time.monotonic() + 10  # its client left: until the door hears it, bounded
        while time.monotonic() < until:
            again = client.post("/v1/batchstring", json={"inputs": texts}, headers=long)
            codes.append(again.status_code)
            if again.status_code == 200:
                break
    assert codes[-1] == 200, codes[-5:]
    assert json.loads(again.text.splitlines()[-1])["counts"] == {"outputs": 10_000, "errors": 0}


def test_a_stream_has_one_access_log_line_and_one_left_by_its_client_says_499(
        gateways: int, tmp_path: Path) -> None:
    with running_server(2, "sim", ["--keys", str(EXAMPLE_KEYS), "--access-log", "json"]
                        ) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        done = client.post("/v1/batchstring", json={"inputs": ["a", "b", "c"]},
                           headers=NDJSON)
        rid = json.loads(done.text.splitlines()[-1])["id"]
        line = logged(server, rid)
        with client.stream("POST", "/v1/batchstring", headers=NDJSON,
                           json={"inputs": [f"x{i}" for i in range(5000)]}) as left:
            assert left.status_code == 200
        until = time.monotonic() + 10  # written once the server heard it go, bounded
        while '"code":"client_closed"' not in server.log_path.read_text() \
                and time.monotonic() < until:
            time.sleep(0.01)
        written = server.log_path.read_text()
    assert {k: line[k] for k in ("status", "path", "tier", "model", "code")} == {
        "status": 200, "path": "/v1/batchstring", "tier": "paid", "model": "default@v1",
        "code": None}
    gone = [json.loads(text) for text in written.splitlines()
            if '"code":"client_closed"' in text]
    assert [(g["status"], g["id"]) for g in gone] == [(499, None)]
