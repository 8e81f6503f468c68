"""Guard stages end to end (issue 36), on real servers, in one process and in a cell: the
model logs every input it runs (`tests.models_logged`), the guards answer on markers
(`tests.models_guards`), so each test reads what reached the model beside what the client
got."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from loadtest.server import RunningServer, running_server
from tests.e2e.helpers import EXAMPLE_KEYS
from tests.models_logged import LOG_VARIABLE, expected

pytestmark = pytest.mark.e2e
PAID = {"Authorization": "Bearer paid-demo-key"}
FREE = {"Authorization": "Bearer free-demo-key"}
CATALOGUE = """
[models.topics]
pre = ["safety"]
post = ["leak"]
{extra}
[models.topics.versions.v1]
spec = "tests.models_logged:batchstring"

[models.safety.versions.v1]
spec = "tests.models_guards:{guard}"

[models.leak.versions.v1]
spec = "tests.models_guards:refuse_output_marker"
"""
LEAKS = "KAEL"  # the logged model answers it reversed: an output the post guard refuses


def serve(tmp_path: Path, extra: str = "", guard: str = "refuse_marker"
          ) -> AbstractContextManager[RunningServer]:
    models = tmp_path / "models.toml"
    models.write_text(CATALOGUE.format(extra=extra, guard=guard))
    return running_server(3, "sim", ["--models", str(models), "--keys", str(EXAMPLE_KEYS)],
                          env={LOG_VARIABLE: str(tmp_path / "runs.log")})


def ran(tmp_path: Path) -> list[str]:
    log = tmp_path / "runs.log"
    return [line.partition("\t")[2] for line in log.read_text().splitlines()] \
        if log.exists() else []


def post(server: RunningServer, body: dict[str, object], headers: dict[str, str]
         ) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/batchstring", json=body, headers=headers, timeout=15)


def test_refused_inputs_and_outputs_never_reach_the_model_or_the_client(
        gateways: int, tmp_path: Path) -> None:
    with serve(tmp_path) as server:
        r = post(server, {"inputs": ["a", "BLOCKME b", LEAKS]}, PAID)
        alone = post(server, {"input": "BLOCKME alone"}, PAID)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["outputs"] == [expected("a"), None, None]
    assert body["refused"] == [{"index": 1, "guard": "safety", "reason": "marker"},
                               {"index": 2, "guard": "leak", "reason": "leak"}]
    assert "BLOCKME" not in r.text and expected(LEAKS) not in r.text
    assert alone.status_code == 422 and alone.json()["error"]["code"] == "refused"
    assert alone.json()["error"]["refused"] == [{"index": 0, "guard": "safety",
                                                 "reason": "marker"}]
    runs = ran(tmp_path)
    assert sorted(runs) == sorted(["a", LEAKS])  # the refused inputs never ran; the rest once


def test_in_parallel_the_model_runs_a_refused_input_whose_output_never_leaves(
        gateways: int, tmp_path: Path) -> None:
    with serve(tmp_path, extra='guard_mode = "parallel"') as server:
        r = post(server, {"inputs": ["a", "BLOCKME b"]}, PAID)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == [expected("a"), None]
    assert expected("BLOCKME b") not in r.text
    assert sorted(ran(tmp_path)) == ["BLOCKME b", "a"]  # beside its guard: it ran


def test_a_guard_that_cannot_answer_fails_open_or_closed_as_the_tier_asks(
        gateways: int, tmp_path: Path) -> None:
    """The guard takes 1.5 s on SLOW, past its 300 ms share: paid fails open (the answer
    names the guard skipped), free fails closed (503 guard_unavailable); both long before
    the request's deadline (5 s)."""
    extra = 'on_guard_failure = { paid = "open", free = "closed" }\nguard_timeout_ms = 300'
    with serve(tmp_path, extra=extra, guard="slow") as server:
        began = time.monotonic()
        paid = post(server, {"input": "SLOW paid"}, PAID)
        paid_s = time.monotonic() - began
        began = time.monotonic()
        free = post(server, {"input": "SLOW free"}, FREE)
        free_s = time.monotonic() - began
    assert paid.status_code == 200, paid.text
    assert paid.json()["output"] == expected("SLOW paid")
    assert paid.headers["Guard-Skipped"] == "safety"
    assert free.status_code == 503 and free.json()["error"]["code"] == "guard_unavailable"
    assert "Retry-After" in free.headers
    assert "SLOW free" not in ran(tmp_path)
    assert paid_s < 4.0 and free_s < 4.0, (paid_s, free_s)  # the deadline is 5 s
