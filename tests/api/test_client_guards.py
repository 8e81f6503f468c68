"""A guard's verdicts as the client returns them: an input a guard refused is None in the
outputs, its verdict in `Outputs.refused` under its index in the call (a split call's
included); a call whose every input was refused raises `Refused` with the verdicts; a guard
that failed closed (503 `guard_unavailable`) is retried; an answer whose verdicts do not
fit its inputs is a ProtocolError."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import batchgate_client as c
from tests.api.client_fakes import FakeClock, inputs_of, make, refuse, run

KINDS = ["sync", "async"]
TOXIC = c.Refusal("safety", "toxic")


def guarded(request: httpx.Request) -> httpx.Response:
    """The server's answer with the guard `safety` refusing every input that starts "bad"."""
    texts = inputs_of(request)
    refused = [{"index": i, "guard": "safety", "reason": "toxic"}
               for i, text in enumerate(texts) if text.startswith("bad")]
    if len(refused) == len(texts):
        return httpx.Response(422, json={"error": {
            "code": "refused", "message": "refused", "refused": refused}})
    body: dict[str, Any] = {"id": "x", "outputs": [
        None if text.startswith("bad") else text[::-1] for text in texts], "model": "m@v1"}
    if refused:
        body["refused"] = refused
    return httpx.Response(200, json=body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_input_is_none_and_its_verdict_is_under_its_index(kind: str) -> None:
    outputs = run(kind, guarded, ["ab", "bad", "cd"])
    assert outputs == ["ba", None, "dc"]
    assert isinstance(outputs, c.Outputs) and outputs.refused == {1: TOXIC}


@pytest.mark.parametrize("kind", KINDS)
def test_a_split_calls_verdicts_are_under_their_index_in_the_call(kind: str) -> None:
    texts = [f"t{i}" for i in range(150)]
    texts[3], texts[120] = "bad-1", "bad-2"
    outputs = run(kind, guarded, texts)
    assert isinstance(outputs, c.Outputs) and outputs.refused == {3: TOXIC, 120: TOXIC}
    assert outputs[3] is None and outputs[120] is None and outputs[121] == "121t"


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_of_a_split_call_refused_whole_leaves_the_others_outputs(kind: str) -> None:
    texts = ["bad"] * 100 + ["ok"] * 5  # the first request: every input refused (422)
    outputs = run(kind, guarded, texts)
    assert outputs == [None] * 100 + ["ko"] * 5
    assert isinstance(outputs, c.Outputs) and outputs.refused == dict.fromkeys(range(100), TOXIC)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", [1, 150])
def test_a_call_whose_every_input_is_refused_raises_refused_with_the_verdicts(
        kind: str, count: int) -> None:
    with pytest.raises(c.Refused) as caught:
        run(kind, guarded, ["bad"] * count)
    assert isinstance(caught.value, c.Unprocessable) and caught.value.status == 422
    assert caught.value.code == "refused"
    assert caught.value.refused == dict.fromkeys(range(count), TOXIC)


def test_a_refusal_is_not_retried() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return guarded(request)

    with pytest.raises(c.Refused):
        make(handler, FakeClock()).batchstring(["bad"])
    assert len(seen) == 1


def test_a_guard_that_failed_closed_is_retried_after_its_retry_after() -> None:
    answers = iter([refuse(503, "guard_unavailable", 2)])
    clock = FakeClock()

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, None) or guarded(request)

    assert make(handler, clock).batchstring(["ab"]) == ["ba"]
    assert len(clock.slept) == 1 and clock.slept[0] >= 2
    assert isinstance(c.error_from(refuse(503, "guard_unavailable")), c.GuardUnavailable)


@pytest.mark.parametrize("body", [
    {"id": "x", "outputs": ["a", None]},  # null with no verdict
    {"id": "x", "outputs": ["a", None], "refused": [{"index": 2, "guard": "g", "reason": "r"}]},
    {"id": "x", "outputs": ["a", "b"], "refused": [{"index": 1, "guard": "g", "reason": "r"}]},
    {"id": "x", "outputs": ["a", None], "refused": [{"index": 1, "guard": "g"}]},
    {"id": "x", "outputs": ["a", None], "refused": {"1": "g"}},
    {"id": "x", "outputs": [None, None], "refused": [{"index": 0, "guard": "g", "reason": "r"},
                                                     {"index": 0, "guard": "g", "reason": "r"}]},
], ids=repr)
def test_verdicts_that_do_not_fit_the_outputs_are_a_protocol_error(body: Any) -> None:
    with pytest.raises(c.ProtocolError):
        run("sync", lambda r: httpx.Response(200, json=body), ["a", "b"])


def test_a_422_refused_that_leaves_out_an_input_is_a_protocol_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"error": {"code": "refused", "message": "no",
                                                   "refused": [{"index": 0, "guard": "g",
                                                                "reason": "r"}]}})

    with pytest.raises(c.ProtocolError):
        run("sync", handler, ["a", "b"])
