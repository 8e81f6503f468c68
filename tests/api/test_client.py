"""The client against a fake server (httpx.MockTransport) and a fake clock: splitting and
collation, one Idempotency-Key per request kept across retries, Retry-After with jitter,
the call's deadline, and typed errors."""

from __future__ import annotations

import httpx
import pytest

import batchgate_client as c
from api.errors import ERRORS
from tests.api.client_fakes import FakeClock, echo, make, refuse


def test_more_than_100_inputs_go_as_several_requests_collated_in_order() -> None:
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(httpx.Response(200, content=request.content).json()["inputs"]))
        return echo(request)

    texts = [f"t{i}" for i in range(250)]
    assert make(handler, FakeClock()).batchstring(texts) == [t[::-1] for t in texts]
    assert sorted(sizes) == [50, 100, 100]


def test_a_refused_request_is_retried_with_its_key_after_retry_after_plus_jitter() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return refuse(503, "over_budget", 2) if len(seen) < 3 else echo(request)

    clock = FakeClock()
    assert make(handler, clock).batchstring(["ab"]) == ["ba"]
    assert len({r.headers["idempotency-key"] for r in seen}) == 1
    assert all(2.0 <= s <= 2.5 for s in clock.slept) and len(set(clock.slept)) == 2


def test_an_anonymous_client_sends_no_idempotency_key() -> None:
    """The server keeps answers per account and refuses the header without an API key."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return refuse(503, "over_budget", 1) if len(seen) < 2 else echo(request)

    assert make(handler, FakeClock(), api_key=None).batchstring(["ab"]) == ["ba"]
    assert len(seen) == 2 and not any("idempotency-key" in r.headers for r in seen)
    assert "authorization" not in seen[0].headers


def test_connection_errors_are_retried_with_backoff() -> None:
    failures = [httpx.ConnectError("refused"), httpx.ReadError("reset")]

    def handler(request: httpx.Request) -> httpx.Response:
        if failures:
            raise failures.pop(0)
        return echo(request)

    clock = FakeClock()
    assert make(handler, clock).batchstring(["ab"]) == ["ba"]
    assert len(clock.slept) == 2 and all(0 <= s <= 0.1 for s in clock.slept)


def test_a_wait_past_the_deadline_raises_at_once() -> None:
    clock = FakeClock()
    with pytest.raises(c.Overloaded) as caught:
        make(lambda r: refuse(503, "queue_full", 5), clock, timeout=3).batchstring(["a"])
    assert caught.value.retry_after == 5 and clock.slept == []


def test_every_attempt_carries_what_is_left_of_the_deadline() -> None:
    clock, timeouts = FakeClock(), []

    def handler(request: httpx.Request) -> httpx.Response:
        timeouts.append(int(request.headers["x-request-timeout-ms"]))
        return refuse(429, "rate_limited", 1) if len(timeouts) == 1 else echo(request)

    make(handler, clock, timeout=10).batchstring(["a"])
    assert timeouts[0] == 10_000 and 8_700 <= timeouts[1] <= 9_000


def test_a_rate_limited_retry_takes_a_new_key_as_nothing_ran() -> None:
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        return refuse(429, "rate_limited", 1) if len(keys) == 1 else echo(request)

    make(handler, FakeClock()).batchstring(["a"])
    assert len(set(keys)) == 2


def test_a_final_error_raises_its_typed_exception_without_retrying() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return refuse(422, "idempotency_key_reused")

    with pytest.raises(c.IdempotencyKeyReused) as caught:
        make(handler, FakeClock()).batchstring(["a"])
    assert len(calls) == 1 and caught.value.status == 422


def test_every_error_code_maps_to_the_exception_of_its_status() -> None:
    for code, error in ERRORS.items():
        if error.status in (404, 405, 409, 499):  # never an answer to a client's batchstring
            continue
        exc = c.error_from(refuse(error.status, code))
        assert isinstance(exc, c.BY_STATUS[error.status]) and exc.code == code


@pytest.mark.anyio
async def test_the_async_client_sends_the_requests_of_a_call_concurrently() -> None:
    texts = [f"t{i}" for i in range(201)]
    async with c.AsyncClient("http://batchgate", transport=httpx.MockTransport(echo)) as ac:
        assert await ac.batchstring(texts) == [t[::-1] for t in texts]
