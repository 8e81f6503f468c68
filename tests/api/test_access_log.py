"""The access log: one JSON line per request with what the answer says of itself, never
the inputs, outputs or error messages; and nothing at all in the way when it is off."""

from __future__ import annotations

import io

import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send

from api.access_log import with_access_log
from api.auth import KeyRing, Principal
from batcher import Tier

KEYS = KeyRing({"k1": Principal(Tier.PAID, "acme", "k1")}, frozenset())


def answering(status: int, body: bytes, headers: list[tuple[bytes, bytes]]):  # type: ignore[no-untyped-def]
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    return app


async def call(app, authorization: bytes | None = None) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    headers = [(b"authorization", authorization)] if authorization else []
    scope = {"type": "http", "method": "POST", "path": "/v1/batchstring", "headers": headers}

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        pass

    await with_access_log(app, lambda: KEYS, out)(scope, receive, send)
    (line,) = out.getvalue().splitlines()
    return orjson.loads(line)  # type: ignore[no-any-return]


@pytest.mark.anyio
async def test_an_answer_is_logged_with_its_id_tier_account_and_timings() -> None:
    body = b'{"id":"3159b9d8d7ae4279","outputs":["secret output"]}'
    app = answering(200, body, [(b"server-timing", b"queue;dur=51.0, batch;dur=23.7")])
    line = await call(app, b"Bearer k1")
    assert (line["id"], line["tier"], line["account"]) == ("3159b9d8d7ae4279", "paid", "acme")
    assert (line["status"], line["code"], line["queue_ms"], line["batch_ms"]) == (
        200, None, 51.0, 23.7)
    assert "secret output" not in orjson.dumps(line).decode()


@pytest.mark.anyio
async def test_an_error_is_logged_with_its_code_but_not_its_message() -> None:
    body = b'{"error":{"code":"model_error","message":"ValueError: bad \'my input\'"}}'
    line = await call(answering(500, body, [(b"server-timing", b"total;dur=3.0")]))
    assert (line["status"], line["code"], line["tier"], line["account"]) == (
        500, "model_error", "free", "anonymous")
    assert "my input" not in orjson.dumps(line).decode() and line["id"] is None


@pytest.mark.anyio
async def test_an_unknown_key_is_logged_without_tier_or_account() -> None:
    body = b'{"error":{"code":"unauthorized","message":"unknown API key"}}'
    line = await call(answering(401, body, []), b"Bearer nope")
    assert (line["tier"], line["account"], line["code"]) == (None, None, "unauthorized")


def test_with_the_log_off_the_app_is_served_unwrapped() -> None:
    from api.app import create_app
    from api.settings import Settings

    plain = create_app(Settings(model="sim"))
    logged = create_app(Settings(model="sim", access_log="json"))
    assert plain.__qualname__ != logged.__qualname__
    assert "with_access_log" not in plain.__qualname__
