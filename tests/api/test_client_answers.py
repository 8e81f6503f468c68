"""The client holds every answer to the contract: a 200 is `{"outputs": [...]}` with one
string per input, or the call raises ProtocolError (never retried); a status batchgate never
sends is one too; the blocking and the async client raise the same exception, and a split
call raises the first failure of its requests, alone."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import httpx
import pytest

import batchgate_client as c
from tests.api.client_fakes import echo, inputs_of, refuse, run

KINDS = ["sync", "async"]


def answer(body: Any) -> httpx.Response:
    return httpx.Response(200, json=body)


@pytest.mark.parametrize("kind", KINDS)
def test_fewer_outputs_than_inputs_is_a_protocol_error(kind: str) -> None:
    with pytest.raises(c.ProtocolError, match="1 outputs for 2 inputs") as caught:
        run(kind, lambda r: answer({"id": "x", "outputs": ["only-one"]}), ["a", "b"])
    assert caught.value.status == 200


@pytest.mark.parametrize("kind", KINDS)
def test_too_many_outputs_in_a_split_call_is_a_protocol_error(kind: str) -> None:
    """150 inputs go as 100 + 50; 99 outputs each would collate to 198."""
    with pytest.raises(c.ProtocolError, match="99 outputs for"):
        run(kind, lambda r: answer({"id": "x", "outputs": ["o"] * 99}),
            [f"t{i}" for i in range(150)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("body", [
    {"id": "x", "outputs": [1, None]},  # not strings
    {"id": "x", "outputs": "ab"},  # a string is no list, though it has 2 characters
    {"id": "x", "outputs": {"0": "a", "1": "b"}},
    {"id": "x"},  # no outputs
    {"id": "x", "output": "ab"},
    {"error": {"code": "internal", "message": "a 200 that says it failed"}},
    ["a", "b"],  # not an object
    None,
    "ab",
], ids=repr)
def test_a_200_of_another_shape_is_a_protocol_error(kind: str, body: Any) -> None:
    with pytest.raises(c.ProtocolError):
        run(kind, lambda r: answer(body), ["a", "b"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("content", [b"<html>oops</html>", b"", b"\xff\xfe\x00",
                                     b"[" * 100_000], ids=["html", "empty", "binary", "deep"])
def test_a_200_that_is_not_json_is_a_protocol_error_and_a_value_error(
        kind: str, content: bytes) -> None:
    with pytest.raises(c.ProtocolError, match="not JSON") as caught:
        run(kind, lambda r: httpx.Response(200, content=content), ["a"])
    assert isinstance(caught.value, ValueError)  # what a caller of the old client caught


@pytest.mark.parametrize("status", [201, 204, 302])
def test_a_status_batchgate_never_sends_is_a_protocol_error(status: int) -> None:
    with pytest.raises(c.ProtocolError) as caught:
        run("sync", lambda r: httpx.Response(status, headers={"Location": "/"}), ["a"])
    assert caught.value.status == status


def test_a_protocol_error_is_not_retried() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer({"id": "x", "outputs": []})

    with pytest.raises(c.ProtocolError):
        run("sync", handler, ["a"])
    assert len(seen) == 1


def fail_chunk_with(marker: str, error: httpx.Response) -> Any:
    return lambda r: error if marker in inputs_of(r) else echo(r)


@pytest.mark.parametrize("kind", KINDS)
def test_one_failing_request_of_a_split_call_raises_its_own_error_alone(kind: str) -> None:
    texts = [f"t{i}" for i in range(250)]
    with pytest.raises(c.BatchgateError) as caught:
        run(kind, fail_chunk_with("t120", refuse(413, "input_too_large")), texts)
    assert type(caught.value) is c.PayloadTooLarge and caught.value.code == "input_too_large"


@pytest.mark.parametrize("kind", KINDS)
def test_a_split_call_whose_requests_all_fail_raises_one_of_them_alone(kind: str) -> None:
    with pytest.raises(c.BatchgateError) as caught:
        run(kind, lambda r: refuse(422, "unknown_model"), [f"t{i}" for i in range(250)])
    assert type(caught.value) is c.UnknownModel


def test_a_split_call_raises_a_broken_answer_of_one_request_alone() -> None:
    for kind in KINDS:
        with pytest.raises(c.ProtocolError):
            run(kind, fail_chunk_with("t0", answer({"outputs": []})), ["t0", "t1", "t2"],
                timeout=30)


def test_once_a_request_fails_the_others_of_its_call_start_no_new_attempt() -> None:
    """The request refused with Retry-After 10 stops waiting the moment its sibling fails;
    it would otherwise come back after 10 s and keep the call (and the pool) busy."""
    refused = threading.Event()
    retries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if "t0" in inputs_of(request):  # fails once the other has been refused
            refused.wait(timeout=5)
            return refuse(413, "input_too_large")
        if refused.is_set():
            retries.append("again")
        refused.set()
        return refuse(503, "over_budget", 10)

    with c.Client("http://batchgate", "k", timeout=15, max_inputs=1,
                  transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(c.PayloadTooLarge):
        client.batchstring(["t0", "t1"])
    assert retries == []


@pytest.mark.anyio
async def test_the_async_client_cancels_the_others_of_a_failed_call() -> None:
    retries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if "t0" in inputs_of(request):
            return refuse(413, "input_too_large")
        retries.append("again")
        return refuse(503, "over_budget", 10)

    with anyio.fail_after(5):
        async with c.AsyncClient("http://batchgate", "k", timeout=15, max_inputs=1,
                                 transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(c.PayloadTooLarge):
                await client.batchstring(["t0", "t1"])
    assert len(retries) <= 1
