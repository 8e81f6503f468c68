"""The access log: one JSON line per request, made where its answer is made, with what the
request was and how it went, never its inputs, outputs or error message; the direct way
still taken while it is on, and no sink at all when it is off."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from starlette.applications import Starlette

from api.config import KeyRing, Principal, Settings
from api.http import (
    Answered,
    ClientWatch,
    DirectCall,
    DirectRoute,
    Job,
    Rendered,
    Routes,
    StatusCall,
    http_app,
)
from api.http.access_log import AccessLog, hot, record
from api.metrics import Metrics
from batcher import Tier
from tests.api.serving import serving

pytestmark = pytest.mark.anyio
PAID = Principal(Tier.PAID, "acme", "k1")
KEYS = KeyRing({"k1": PAID}, frozenset())
BEARER = {"Authorization": "Bearer k1"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


def line_of(served: Any) -> dict[str, Any]:
    return orjson.loads(record(served))  # type: ignore[no-any-return]


def answered(output: str, batch_id: int) -> Answered:
    return Answered([output], (0.0123, 0.051), 0.0237, (batch_id,), 1)


def test_an_answer_is_logged_with_its_id_tier_account_and_timings() -> None:
    line = line_of(hot(PAID, 0.0786, answered("secret output", 4), "3159b9d8d7ae4279"))
    assert (line["id"], line["tier"], line["account"]) == ("3159b9d8d7ae4279", "paid", "acme")
    assert (line["status"], line["code"], line["queue_ms"], line["batch_ms"]) == (
        200, None, 51.0, 23.7)
    assert (line["batch_ids"], line["attempts"], line["latency_ms"]) == ([4], 1, 78.6)
    assert (line["method"], line["path"], line["replayed"]) == ("POST", "/v1/batchstring", False)
    assert "secret output" not in record(hot(PAID, 0.0786, answered("secret output", 4), "x"))


def test_an_error_is_logged_with_its_code_but_not_its_message() -> None:
    body = b'{"error":{"code":"model_error","message":"ValueError: bad \'my input\'"}}'
    text = record(hot(PAID, 0.003, Rendered(500, body)))
    line = orjson.loads(text)
    assert (line["status"], line["code"], line["id"], line["batch_ids"]) == (
        500, "model_error", None, None)
    assert "my input" not in text


def test_a_refusal_made_at_the_door_is_logged_by_its_code() -> None:
    line = line_of(hot(PAID, 0.001, code="body_too_large"))
    assert (line["status"], line["code"], line["tier"]) == (413, "body_too_large", "paid")


def test_an_unknown_key_is_logged_without_tier_or_account() -> None:
    line = line_of(hot(None, 0.001, code="unauthorized"))
    assert (line["tier"], line["account"], line["status"]) == (None, None, 401)


def test_a_kept_answer_is_logged_as_replayed_with_the_id_its_body_carries() -> None:
    kept = Rendered(200, b'{"id":"0123abcd","outputs":["out"]}',
                    (("Idempotent-Replayed", "true"),))
    line = line_of(hot(PAID, 0.001, kept))
    assert (line["id"], line["replayed"], line["code"]) == ("0123abcd", True, None)


async def test_the_lines_of_one_loop_turn_are_written_together_after_it() -> None:
    out = Writes()
    log = AccessLog(out)  # type: ignore[arg-type]
    for i in range(3):
        log.put(hot(PAID, 0.001, answered("o", i), f"id{i}"))
    assert out.writes == []
    await anyio.lowlevel.checkpoint()  # the turn is over
    (written,) = out.writes
    assert [orjson.loads(line)["id"] for line in written.splitlines()] == ["id0", "id1", "id2"]


class Writes:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


class AsgiCore:
    """The routes' core: answers "asgi" from batch 3."""

    async def run(self, job: Job, client: ClientWatch) -> Answered:
        return answered("asgi", 3)

    async def ready(self) -> dict[str, object]:
        return {"ready": True}

    async def workers(self) -> list[dict[str, Any]]:
        return []

    async def metrics_text(self) -> bytes:
        return b""

    async def cell(self) -> dict[str, Any]:
        return {"gateways": [], "core": None}

    async def status(self, call: StatusCall, *args: Any) -> Any:
        return await getattr(self, call.value)(*args)


class Instant(DirectRoute):
    """The direct way: answers "direct" from batch 7, a loop turn later."""

    def admit(self, call: DirectCall, job: Job) -> None:
        asyncio.get_running_loop().call_soon(self.answer, call, answered("direct", 7))


@asynccontextmanager
async def no_lifespan(app: Starlette) -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def logged_server(log: bool = True) -> AsyncIterator[tuple[str, io.StringIO, Routes]]:
    """A real uvicorn server over fake cores, its access log written to the stream."""
    settings = Settings(model="sim", access_log="json" if log else "off")
    routes = Routes(AsgiCore(), settings, KEYS, Metrics())
    out = io.StringIO()
    if log:
        routes.access_log = AccessLog(out)
    app, direct = http_app(routes, no_lifespan), Instant(routes)
    async with serving(app, direct) as port:
        yield f"http://127.0.0.1:{port}", out, routes


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


async def test_with_the_log_on_a_plain_request_takes_the_direct_way_and_is_logged() -> None:
    async with logged_server() as (url, out, _), httpx.AsyncClient(base_url=url) as client:
        answer = await client.post("/v1/batchstring", json={"input": "x"}, headers=BEARER)
    body = answer.json()
    assert body["output"] == "direct"
    (line,) = lines(out)
    assert (line["id"], line["account"], line["batch_ids"]) == (body["id"], "acme", [7])


async def test_a_keyed_request_takes_asgi_and_is_logged_with_its_answers_id() -> None:
    async with logged_server() as (url, out, _), httpx.AsyncClient(base_url=url) as client:
        answer = await client.post("/v1/batchstring", json={"inputs": ["x"]},
                                   headers={**BEARER, "Idempotency-Key": "k"})
    body = answer.json()
    assert body["outputs"] == ["asgi"]
    (line,) = lines(out)
    assert (line["id"], line["tier"], line["batch_ids"]) == (body["id"], "paid", [3])


async def test_an_error_on_the_direct_way_is_logged_with_its_code() -> None:
    async with logged_server() as (url, out, _), httpx.AsyncClient(base_url=url) as client:
        answer = await client.post("/v1/batchstring", content=b"{oops", headers=BEARER)
    assert answer.status_code == 400
    (line,) = lines(out)
    assert (line["status"], line["code"], line["account"]) == (400, "malformed_json", "acme")


async def test_the_other_paths_are_logged_by_the_wrapper() -> None:
    async with logged_server() as (url, out, _), httpx.AsyncClient(base_url=url) as client:
        await client.get("/healthz")
        await client.get("/nope", headers=BEARER)
    health, missing = lines(out)
    assert (health["path"], health["status"], health["code"]) == ("/healthz", 200, None)
    assert (missing["status"], missing["code"], missing["tier"]) == (404, "not_found", "paid")


async def test_with_the_log_off_there_is_no_sink_and_the_direct_way_is_taken() -> None:
    async with logged_server(log=False) as (url, out, routes), \
            httpx.AsyncClient(base_url=url) as client:
        answer = await client.post("/v1/batchstring", json={"input": "x"})
    assert answer.json()["output"] == "direct"
    assert routes.access_log is None and out.getvalue() == ""


def test_an_open_inference_protocol_error_is_logged_with_its_code() -> None:
    body = b'{"error":"no model named \'nope\'","code":"not_found"}'
    line = line_of(hot(PAID, 0.002, Rendered(404, body), path="/v2/models/{name}/infer"))
    assert (line["status"], line["code"], line["path"]) == (
        404, "not_found", "/v2/models/{name}/infer")
