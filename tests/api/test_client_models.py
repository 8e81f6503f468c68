"""The client and several models: `model=` per client or per call, sent in the body; the
version that ran the outputs (`.model`, and `.models` per request of a split call); a
version still loading (503 model_loading) retried after its Retry-After, an unknown model
raised at once. Against the fake server, then a real one serving two models."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import batchgate_client as c
from loadtest.server import RunningServer, running_server
from tests.api.client_fakes import FakeClock, Handler, inputs_of, refuse

KINDS = ["sync", "async"]


def body_of(request: httpx.Request) -> dict[str, Any]:
    body: dict[str, Any] = httpx.Response(200, content=request.content).json()
    return body


def ran_on(version: str | None) -> Handler:
    """A fake server whose every answer says `version` ran it (None: says nothing)."""
    def handler(request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = {"id": "x", "outputs": [s[::-1] for s in inputs_of(request)]}
        if version is not None:
            body["model"] = version
        return httpx.Response(200, json=body)

    return handler


def call(kind: str, handler: Handler, texts: list[str], model: str | None = None,
         client_model: str | None = None, clock: FakeClock | None = None,
         timeout: float = 30.0) -> c.Outputs:
    """`batchstring(texts, model)` on a blocking or an async client of the fake."""
    clock = clock or FakeClock()
    options: dict[str, Any] = {"timeout": timeout, "model": client_model, "clock": clock,
                               "rng": random.Random(1)}
    if kind == "sync":
        with c.Client("http://batchgate", "k", transport=httpx.MockTransport(handler),
                      sleep=clock.sleep, **options) as client:
            return client.batchstring(texts, model=model)

    async def run() -> c.Outputs:
        async with c.AsyncClient("http://batchgate", "k", sleep=clock.asleep,
                                 transport=httpx.MockTransport(handler), **options) as client:
            return await client.batchstring(texts, model=model)

    return anyio.run(run)


@pytest.mark.parametrize("kind", KINDS)
def test_a_calls_model_goes_in_the_body_over_the_clients_own(kind: str) -> None:
    sent: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(body_of(request).get("model"))
        return ran_on("topics@v2")(request)

    call(kind, handler, ["a"], model="topics@v2", client_model="other")
    call(kind, handler, ["a"], client_model="other")
    call(kind, handler, ["a"])
    assert sent == ["topics@v2", "other", None]


@pytest.mark.parametrize("kind", KINDS)
def test_the_outputs_say_which_version_ran_them(kind: str) -> None:
    outputs = call(kind, ran_on("topics@v2"), ["ab", "cd"], model="topics")
    assert outputs == ["ba", "dc"] and outputs.model == "topics@v2"
    assert call(kind, ran_on(None), ["ab"]).model is None  # an older server says nothing


@pytest.mark.parametrize("kind", KINDS)
def test_a_split_call_on_two_versions_names_each_requests_own(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return ran_on("m@v1" if "t0" in inputs_of(request) else "m@v2")(request)

    texts = [f"t{i}" for i in range(150)]
    outputs = call(kind, handler, texts)
    assert outputs == [t[::-1] for t in texts]
    assert outputs.models == ("m@v1", "m@v2") and outputs.model is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_that_is_not_a_string_is_a_protocol_error(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "x", "outputs": ["a"], "model": 7})

    with pytest.raises(c.ProtocolError, match="model"):
        call(kind, handler, ["a"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_version_still_loading_is_asked_again_after_its_retry_after(kind: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return refuse(503, "model_loading", 3) if len(seen) == 1 else ran_on("m@v2")(request)

    clock = FakeClock()
    assert call(kind, handler, ["ab"], model="m@v2", clock=clock).model == "m@v2"
    assert len(seen) == 2 and 3.0 <= clock.slept[0] <= 3.75
    assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_load_that_ends_past_the_deadline_raises_model_loading_at_once(kind: str) -> None:
    clock = FakeClock()
    with pytest.raises(c.ModelLoading) as caught:
        call(kind, lambda r: refuse(503, "model_loading", 40), ["a"], clock=clock, timeout=5)
    assert isinstance(caught.value, c.Unavailable) and caught.value.retry_after == 40
    assert clock.slept == []


@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_model_raises_at_once(kind: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return refuse(422, "unknown_model")

    with pytest.raises(c.UnknownModel) as caught:
        call(kind, handler, ["a"], model="nope")
    assert isinstance(caught.value, c.Unprocessable) and len(seen) == 1


# -- a real server with two models -------------------------------------------------------------
TWO_MODELS = """
[models.a]
[models.a.versions.v1]
spec = "tests.models_versions:v1"
[models.b]
[models.b.versions.v2]
spec = "tests.models_versions:v2"
"""
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    catalogue = tmp_path_factory.mktemp("models") / "two.toml"
    catalogue.write_text(TWO_MODELS)
    args = ["--models", str(catalogue), "--keys", str(ROOT / "examples/keys.toml"),
            "--batch-latency-ms", "5"]
    with running_server(workers=2, args=args) as srv:
        yield srv


@pytest.mark.e2e
def test_each_model_answers_a_blocking_call_that_names_it(two_models: RunningServer) -> None:
    with c.Client(two_models.url, "paid-demo-key", timeout=10) as client:
        first = client.batchstring(["ab"])  # none named: the catalogue's first model
        a, b = client.batchstring(["ab"], model="a"), client.batchstring(["ab"], model="b@v2")
        assert (first, first.model) == (["v1:ba"], "a@v1")
        assert (a, a.model, b, b.model) == (["v1:ba"], "a@v1", ["v2:AB"], "b@v2")
        with pytest.raises(c.UnknownModel):
            client.batchstring(["ab"], model="a@v9")


@pytest.mark.e2e
def test_an_async_client_of_one_model_gets_that_models_answers(
        two_models: RunningServer) -> None:
    async def run() -> c.Outputs:
        async with c.AsyncClient(two_models.url, "paid-demo-key", model="b",
                                 timeout=10) as client:
            return await client.batchstring([f"t{i}" for i in range(150)])

    outputs = anyio.run(run)
    assert outputs == [f"v2:T{i}" for i in range(150)]
    assert outputs.models == ("b@v2", "b@v2") and outputs.model == "b@v2"
