"""The gateway's end of the link against a core that stops answering with its socket open
(stopped, or stuck in a long turn): every job, the ASGI way's (`RemoteCore.run`) and the
direct way's (`RemoteRoute`), ends in a 503 `core_unavailable` with Retry-After at its
timeout plus `BACKSTOP_MARGIN_S`, never a hang, and the core is told to withdraw it.

The mute core is a Unix server that reads every frame and answers none; it keeps the
messages it read, so a test sees what the gateway told it.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

import api.gateway.remote as remote_module
from api.config import Principal, Settings, load_keys
from api.gateway import RemoteCore, RemoteRoute
from api.gateway.frames import Message
from api.http import Job, Rendered, Routes, http_app
from api.metrics import Metrics
from batcher import Tier
from tests.api.serving import serving

pytestmark = pytest.mark.anyio
EXAMPLE_KEYS = Path(__file__).parents[3] / "examples" / "keys.toml"
WHO = Principal(Tier.PAID, "acme", "paid-demo-key")
MARGIN_S = 0.2  # the backstop's margin in these tests (the module's is a second)
TIMEOUT_S = 0.1
SLACK_S = 1.0  # what a busy machine may add to a timer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def short_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "BACKSTOP_MARGIN_S", MARGIN_S)


class MuteCore:
    """Reads the link's frames and answers none; `heard` holds every message read."""

    def __init__(self) -> None:
        self.heard: list[Message] = []
        self._changed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack("!I", await reader.readexactly(4))
                self.heard += pickle.loads(await reader.readexactly(size))
                self._changed.set()
        except asyncio.IncompleteReadError:  # the gateway hung up
            writer.close()

    async def wait_heard(self, condition: Callable[[list[Message]], bool]) -> None:
        with anyio.fail_after(5):
            while not condition(self.heard):
                self._changed.clear()
                await self._changed.wait()


@asynccontextmanager
async def mute_core(tmp_path: Path) -> AsyncIterator[tuple[MuteCore, RemoteCore]]:
    """A mute core, and a gateway's `RemoteCore` connected to it."""
    core, path = MuteCore(), str(tmp_path / "mute.sock")
    server = await asyncio.start_unix_server(core.serve, path)
    async with server:
        remote = RemoteCore(path, reconnect=False)
        await remote.connect()
        yield core, remote
        assert remote._conn is not None and remote._conn.transport is not None
        remote._conn.transport.close()


def is_core_unavailable(outcome: object) -> bool:
    return isinstance(outcome, Rendered) and outcome.status == 503 \
        and b"core_unavailable" in outcome.body and ("Retry-After", "1") in outcome.headers


class Staying:
    """A client that never hangs up (`ClientWatch`)."""

    def watch(self, leave: Callable[[], object]) -> None:
        pass

    def unwatch(self) -> None:
        pass


def kinds(heard: list[Message]) -> list[tuple[str, int]]:
    return [(m[0], m[1]) for m in heard]


# -- the ASGI way: RemoteCore.run ---------------------------------------------------------------
async def test_a_job_the_core_never_answers_ends_503_at_its_timeout_plus_the_margin(
    tmp_path: Path,
) -> None:
    async with mute_core(tmp_path) as (_, remote):
        started = time.monotonic()
        with anyio.fail_after(TIMEOUT_S + MARGIN_S + SLACK_S):
            outcome = await remote.run(Job(WHO, ["a"], True, TIMEOUT_S), Staying())
        waited = time.monotonic() - started
    assert isinstance(outcome, Rendered) and is_core_unavailable(outcome), outcome
    assert b"deadline" in outcome.body
    assert TIMEOUT_S + MARGIN_S <= waited < TIMEOUT_S + MARGIN_S + SLACK_S


async def test_a_job_past_its_backstop_is_withdrawn_at_the_core_and_forgotten_here(
    tmp_path: Path,
) -> None:
    async with mute_core(tmp_path) as (core, remote):
        await remote.run(Job(WHO, ["a"], True, TIMEOUT_S), Staying())
        await core.wait_heard(lambda heard: len(heard) == 2)
        assert not remote.jobs
    (run, cancel) = core.heard
    assert run[0] == "run" and cancel == ("cancel", run[1])


async def test_each_of_many_jobs_waiting_on_a_mute_core_gets_its_own_503(
    tmp_path: Path,
) -> None:
    async with mute_core(tmp_path) as (core, remote):
        with anyio.fail_after(TIMEOUT_S * 4 + MARGIN_S + SLACK_S):
            outcomes = await asyncio.gather(*(
                remote.run(Job(WHO, [f"j{n}"], True, TIMEOUT_S * (1 + n)), Staying())
                for n in range(4)))
        await core.wait_heard(lambda heard: len(heard) == 8)
    assert all(is_core_unavailable(o) for o in outcomes)
    runs = {rid for kind, rid in kinds(core.heard) if kind == "run"}
    assert {rid for kind, rid in kinds(core.heard) if kind == "cancel"} == runs
    assert len(runs) == 4


# -- the direct way: RemoteRoute, under a real uvicorn --------------------------------------
@asynccontextmanager
async def no_lifespan(app: object) -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def gateway_http(remote: RemoteCore
                       ) -> AsyncIterator[tuple[httpx.AsyncClient, RemoteRoute]]:
    """A gateway's HTTP side in this process, both ways over `remote`: a plain POST takes
    the direct way (`RemoteRoute`), a keyed one the ASGI way (`RemoteCore.run`)."""
    routes = Routes(remote, Settings(model="sim"), load_keys(EXAMPLE_KEYS), Metrics())
    route = RemoteRoute(routes, remote)
    async with serving(http_app(routes, no_lifespan), route) as port, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield client, route


@pytest.mark.parametrize("way", ["direct", "asgi"])
async def test_a_request_to_a_mute_core_gets_503_core_unavailable_by_its_backstop(
    tmp_path: Path, way: str,
) -> None:
    headers = {"Authorization": "Bearer paid-demo-key",
               "X-Request-Timeout-Ms": str(int(TIMEOUT_S * 1000))}
    if way == "asgi":
        headers["Idempotency-Key"] = "k"  # a keyed request never takes the direct way
    async with mute_core(tmp_path) as (core, remote), gateway_http(remote) as (client, _):
        started = time.monotonic()
        with anyio.fail_after(TIMEOUT_S + MARGIN_S + SLACK_S):
            r = await client.post("/v1/batchstring", json={"input": "a"}, headers=headers)
        waited = time.monotonic() - started
        await core.wait_heard(lambda heard: len(heard) == 2)
        assert remote._conn is not None
        assert not remote.jobs and not remote.calls
    assert r.status_code == 503 and r.json()["error"]["code"] == "core_unavailable"
    assert r.headers["retry-after"] == "1"
    assert TIMEOUT_S + MARGIN_S <= waited < TIMEOUT_S + MARGIN_S + SLACK_S
    (run, cancel) = core.heard
    assert run[0] == "run" and (run[8] is None) == (way == "direct")  # keyed or not
    assert cancel == ("cancel", run[1])


async def test_a_direct_call_answered_in_time_leaves_no_backstop_behind(
    tmp_path: Path,
) -> None:
    """The core's answer ends the call's backstop: its timer slot goes with it."""
    async with mute_core(tmp_path) as (core, remote), gateway_http(remote) as (client, route):
        answered = asyncio.ensure_future(client.post(
            "/v1/batchstring", json={"input": "a"},
            headers={"Authorization": "Bearer paid-demo-key"}))
        await core.wait_heard(lambda heard: len(heard) == 1)
        assert len(route._backstops) == 1
        ((_, rid, *_),) = core.heard
        assert remote._conn is not None
        remote._conn.received([("ok", rid, ["x"], (0.0,), 0.1, (1,), 1)])  # as the core
        with anyio.fail_after(SLACK_S):
            r = await answered
        assert r.status_code == 200 and r.json()["output"] == "x"
        assert len(route._backstops) == 0 and not remote.jobs
