"""`stream()` of both clients against a fake streaming server (httpx.MockTransport) and a
fake clock: results in completion order by index, typed per-input errors, the done event,
resumes with a key (Last-Event-ID, ?after=) that yield every index once, StreamBroken
without one, refusals before the stream as a call's, and a stream that breaks the protocol."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import batchgate_client as c
from tests.api.client_fakes import FakeClock, refuse
from tests.api.client_stream_fakes import Body, StreamServer, client, collect, ndjson, sse

KINDS = ["sync", "async"]
FORMATS = ["sse", "ndjson"]
TEXTS = ["ab", "cd", "ef", "gh"]
ORDER = [2, 0, 3, 1]
ANSWERED = [c.Output(2, "fe"), c.Output(0, "ba"), c.Output(3, "hg"), c.Output(1, "dc")]
DONE = c.Done("a1", "topics@v1", 4, 0)


def stream_of(events: list[dict[str, Any]], fmt: str = "sse") -> httpx.Response:
    media = "text/event-stream" if fmt == "sse" else "application/x-ndjson"
    content = sse(events) if fmt == "sse" else ndjson(events)
    return httpx.Response(200, headers={"Content-Type": media}, stream=Body(content))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_results_come_in_completion_order_by_index_then_the_done_event(
        kind: str, fmt: str) -> None:
    server = StreamServer(order=ORDER)
    read = collect(kind, server, TEXTS, format=fmt)
    assert read.results == ANSWERED and read.done == DONE and read.error is None
    request = server.requests[0]
    assert request.headers["accept"] == {"sse": "text/event-stream",
                                         "ndjson": "application/x-ndjson"}[fmt]
    assert json.loads(request.content) == {"inputs": TEXTS}
    assert "last-event-id" not in request.headers and "after" not in request.url.params


@pytest.mark.parametrize("kind", KINDS)
def test_each_inputs_error_is_typed_by_its_code_and_the_stream_goes_on(kind: str) -> None:
    errors = {2: {"code": "deadline_exceeded", "message": "late"},
              0: {"code": "model_error", "message": "raised"},
              3: {"code": "guard_unavailable", "message": "slow guard"},
              1: {"code": "refused", "message": "no", "guard": "safety", "reason": "violence"}}
    read = collect(kind, StreamServer(order=ORDER, errors=errors), TEXTS)
    assert [(type(r.error), r.index, r.error.code) for r in read.results
            if isinstance(r, c.Failure)] == [
        (c.DeadlineExceeded, 2, "deadline_exceeded"), (c.ModelError, 0, "model_error"),
        (c.GuardUnavailable, 3, "guard_unavailable"), (c.Refused, 1, "refused")]
    refused = read.results[3]
    assert isinstance(refused, c.Failure) and refused.refusal == c.Refusal("safety", "violence")
    assert read.results[0].refusal is None  # type: ignore[union-attr]
    assert read.done == c.Done("a1", "topics@v1", 0, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_a_dropped_sse_stream_resumes_after_the_last_id_with_the_same_body_and_key(
        kind: str) -> None:
    server = StreamServer(order=ORDER, cuts=[2, 1])
    read = collect(kind, server, TEXTS, model="topics")
    assert read.results == ANSWERED and read.done == DONE and read.error is None
    assert [r.headers.get("last-event-id") for r in server.requests] == [None, "1", "2"]
    assert len({r.headers["idempotency-key"] for r in server.requests}) == 1
    assert {r.content for r in server.requests} == {
        json.dumps({"inputs": TEXTS, "model": "topics"}, separators=(",", ":")).encode()}


@pytest.mark.parametrize("kind", KINDS)
def test_a_dropped_ndjson_stream_resumes_after_the_events_taken(kind: str) -> None:
    server = StreamServer(order=ORDER, cuts=[3, 0])
    read = collect(kind, server, TEXTS, format="ndjson", idempotency_key="mine")
    assert read.results == ANSWERED and read.done == DONE
    assert [r.url.params.get("after") for r in server.requests] == [None, "3", "3"]
    assert [r.headers["idempotency-key"] for r in server.requests] == ["mine"] * 3
    assert all("last-event-id" not in r.headers for r in server.requests)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_body_that_ends_before_the_done_event_resumes_too(kind: str, fmt: str) -> None:
    server = StreamServer(order=ORDER, cuts=[4], ends=True)
    read = collect(kind, server, TEXTS, format=fmt)
    assert read.results == ANSWERED and read.done == DONE and len(server.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_key_a_drop_raises_stream_broken_after_what_came(kind: str) -> None:
    server = StreamServer(order=ORDER, cuts=[3])
    read = collect(kind, server, TEXTS, api_key=None)
    assert read.results == ANSWERED[:3] and read.done is None
    assert isinstance(read.error, c.StreamBroken) and isinstance(read.error, c.ConnectionFailed)
    assert len(server.requests) == 1 and "idempotency-key" not in server.requests[0].headers


@pytest.mark.parametrize("kind", KINDS)
def test_resumes_are_bounded(kind: str) -> None:
    server = StreamServer(order=ORDER, cuts=[1, 0, 0, 0])
    read = collect(kind, server, TEXTS, max_resumes=2)
    assert read.results == ANSWERED[:1] and isinstance(read.error, c.StreamBroken)
    assert len(server.requests) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_refusal_before_the_stream_raises_its_typed_error(kind: str) -> None:
    clock = FakeClock()
    read = collect(kind, lambda r: refuse(503, "queue_full", 5), TEXTS, clock=clock)
    assert isinstance(read.error, c.Overloaded) and read.error.retry_after == 5
    assert read.results == [] and len(clock.slept) == 4  # the policy's 5 attempts
    assert all(5 <= s <= 6.25 for s in clock.slept)  # Retry-After, plus jitter


@pytest.mark.parametrize("kind", KINDS)
def test_a_refusal_before_the_stream_is_retried_as_a_calls_with_the_same_key(kind: str) -> None:
    server, seen = StreamServer(order=ORDER), list[httpx.Request]()

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return refuse(429, "rate_limited", 1) if len(seen) == 1 else server(request)

    read = collect(kind, handler, TEXTS)
    assert read.results == ANSWERED and len({r.headers["idempotency-key"] for r in seen}) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_more_inputs_than_max_stream_inputs_are_refused_before_sending(kind: str) -> None:
    server = StreamServer()
    with pytest.raises(c.Unprocessable) as caught:
        client(server, FakeClock(), max_stream_inputs=3).stream(TEXTS)
    assert caught.value.code == "too_many_inputs" and server.requests == []
    assert collect(kind, server, ["x"] * 10_000).done == c.Done("a1", "topics@v1", 10_000, 0)


def test_a_key_without_an_api_key_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="API key"):
        client(StreamServer(), FakeClock(), api_key=None).stream(TEXTS, idempotency_key="k")


DONE_0_0 = {"done": True, "id": "a", "model": "m", "counts": {"outputs": 0, "errors": 0}}
DONE_0_1 = {"done": True, "id": "a", "model": "m", "counts": {"outputs": 0, "errors": 1}}


@pytest.mark.parametrize(("texts", "events", "message"), [
    (["ab", "cd"], [{"index": 0, "output": "ba"}, {"index": 0, "output": "ba"}],
     "input 0 answered twice"),
    (["ab"], [{"index": 1, "output": "x"}], "not one of the 1 inputs'"),
    (["ab"], [{"index": 0, "output": 7}], "input 0's output is not a string"),
    (["ab"], [DONE_0_0], "done after 0 of 1 inputs"),
    (["ab"], [{"index": 0, "output": "ba"}, DONE_0_1], "the stream held 1 and 0"),
    (["ab"], [{"index": 0, "error": {"code": "refused", "message": "no"}}],
     "input 0's refusal names no guard and reason"),
])
def test_a_stream_that_breaks_the_contract_raises_protocol_error(
        texts: list[str], events: list[dict[str, Any]], message: str) -> None:
    read = collect("sync", lambda r: stream_of(events), texts)
    assert isinstance(read.error, c.ProtocolError) and message in str(read.error)


def test_an_sse_id_out_of_sequence_is_a_protocol_error() -> None:
    body = b'id: 0\ndata: {"index": 1, "output": "dc"}\n\nid: 2\ndata: {"index": 0}\n\n'
    read = collect("sync", lambda r: httpx.Response(
        200, headers={"Content-Type": "text/event-stream"}, content=body), TEXTS[:2])
    assert read.results == [c.Output(1, "dc")]
    assert isinstance(read.error, c.ProtocolError) and "'2' where 1 was next" in str(read.error)


def test_a_200_of_another_media_type_is_a_protocol_error() -> None:
    read = collect("sync", lambda r: httpx.Response(200, json={"outputs": ["ba"]}), ["ab"])
    assert isinstance(read.error, c.ProtocolError) and "application/json" in str(read.error)


@pytest.mark.anyio
async def test_leaving_an_async_stream_early_closes_it() -> None:
    closed: list[bool] = []

    class Tracked(Body):
        async def aclose(self) -> None:
            closed.append(True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"},
                              stream=Tracked(sse([{"index": 0, "output": "ba"}])))

    async with c.AsyncClient("http://b", "k", transport=httpx.MockTransport(handler)) as ac:
        async with ac.stream(["ab", "cd"]) as results:
            assert await anext(results) == c.Output(0, "ba")
        assert closed == [True] and results.done is None


def test_leaving_a_stream_early_closes_it() -> None:
    closed: list[bool] = []

    class Tracked(Body):
        def close(self) -> None:
            closed.append(True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "application/x-ndjson"},
                              stream=Tracked(ndjson([{"index": 0, "output": "ba"}])))

    with c.Client("http://b", "k", transport=httpx.MockTransport(handler)) as blocking, \
            blocking.stream(["ab", "cd"], format="ndjson") as results:
        assert next(results) == c.Output(0, "ba")
    assert closed == [True] and results.done is None
