"""The link: a gateway's frames against a real core (its owner task, one worker process
running a counting model) over a real Unix socket, and a gateway's direct way over it.

The test speaks the protocol as a gateway does, so it controls what shares a frame: every
message sent during one loop turn leaves as one frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.abc import TaskGroup
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

import api.gateway.remote as remote_module
from api.cell import LinkServer
from api.cell.link import _GatewayConnection
from api.config import DEFAULT_TIERS, KeyRing, Principal, Settings, TierPolicy, Workers, load_keys
from api.door import Door, Service, build_door
from api.errors import CoreUnavailable
from api.gateway import RemoteCore, RemoteRoute, run_message
from api.gateway.remote import _CoreConnection, _Settles
from api.http import Answered, Job, Rendered, Routes, StatusCall, http_app
from api.metrics import Metrics
from batcher import Tier
from tests.api.serving import serving

pytestmark = pytest.mark.anyio
BATCH_S = 0.4  # each batch holds the one worker this long
ROOMY = 1e9
WHO = Principal(Tier.PAID, "acct", "key")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tiers(**paid: float) -> dict[Tier, TierPolicy]:
    """Limits past any test's load, but for what a test sets on the paid tier."""
    roomy = {t: dataclasses.replace(p, rate=ROOMY, burst=ROOMY, account_rate=ROOMY,
                                    account_burst=ROOMY, budget_ms=ROOMY, timeout_ms=ROOMY)
             for t, p in DEFAULT_TIERS.items()}
    roomy[Tier.PAID] = dataclasses.replace(roomy[Tier.PAID], **paid)
    return roomy


class Gateway:
    """One link, as a gateway holds it; `send` many in one turn to share a frame."""

    def __init__(self, conn: _CoreConnection) -> None:
        self.conn = conn

    def run(self, rid: int, text: str, timeout: float = 60.0) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.conn.core.jobs[rid] = ((), _Settles(future))
        self.conn.send(run_message(rid, Job(WHO, [text], True, timeout)))
        return future

    def cancel(self, rid: int) -> None:
        self.conn.core.jobs.pop(rid, None)
        self.conn.send(("cancel", rid))

    def close(self) -> None:
        assert self.conn.transport is not None
        self.conn.transport.close()


@asynccontextmanager
async def core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits: dict[Tier, TierPolicy]
) -> AsyncIterator[tuple[Service, Door, Path, str]]:
    """A core process's parts in this one: service, door and link server. Yields the
    service, the door, the file the model writes each input it runs to, and the link's
    path."""
    ran = tmp_path / "ran.txt"
    ran.touch()
    monkeypatch.setenv("BATCHGATE_TEST_COUNT_FILE", str(ran))  # the spawned worker's
    settings = Settings(model="tests.models:counting", workers=Workers(1), ready_timeout_s=120,
                        batch_latency_ms=BATCH_S * 1000, max_wait_ms=1)
    service, door, status, _ = build_door(settings, KeyRing({}, frozenset(), tiers=limits),
                                       Metrics())
    server = LinkServer(door, service.clock, status.table)
    path = str(tmp_path / "link.sock")
    async with anyio.create_task_group() as tg:
        await tg.start(service.run)
        await tg.start(server.serve, path)
        yield service, door, ran, path
        server.close()
        await service.drain()
        tg.cancel_scope.cancel()


async def connect(path: str) -> Gateway:
    remote = RemoteCore(path, reconnect=False)
    await remote.connect()
    assert remote._conn is not None
    return Gateway(remote._conn)


async def until(condition: Callable[[], bool]) -> None:
    """Returns once `condition` holds; polls the core's state between its turns, bounded."""
    with anyio.fail_after(30):
        while True:
            if condition():
                return
            await asyncio.sleep(0.005)


async def test_a_frame_of_jobs_gets_each_its_own_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (_, _, ran, path):
        gateway = await connect(path)
        answers = [gateway.run(rid, f"job-{rid}") for rid in range(1, 8)]  # one frame
        with anyio.fail_after(30):
            outcomes = await asyncio.gather(*answers)
        assert [o.outputs for o in outcomes] == [[f"job-{r}"[::-1]] for r in range(1, 8)]
        assert all(isinstance(o, Answered) and len(o.waits) == 1 for o in outcomes)
        assert sorted(ran.read_text().split()) == sorted(f"job-{r}" for r in range(1, 8))


async def test_a_job_over_its_rate_is_refused_alone_and_its_frame_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers(rate=0.01, burst=3)) as (_, _, ran, path):
        gateway = await connect(path)
        answers = [gateway.run(rid, f"job-{rid}") for rid in range(1, 6)]  # one frame
        with anyio.fail_after(30):
            outcomes = await asyncio.gather(*answers)
        assert [type(o) for o in outcomes] == [Answered] * 3 + [Rendered] * 2
        assert all(o.status == 429 and b"rate_limited" in o.body
                   for o in outcomes if isinstance(o, Rendered))
        assert sorted(ran.read_text().split()) == ["job-1", "job-2", "job-3"]


async def test_a_job_cancelled_in_its_own_frame_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (_, _, ran, path):
        gateway = await connect(path)
        kept = gateway.run(1, "kept")
        gateway.run(2, "left")
        gateway.cancel(2)  # the same frame: admitted, then withdrawn before any batch
        with anyio.fail_after(30):
            assert (await kept).outputs == ["tpek"]
        # "left" could only have shared kept's batch: the worker ran nothing else since.
        assert ran.read_text().split() == ["kept"]


async def test_a_queued_job_past_its_deadline_is_answered_504_while_the_worker_is_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (service, _, ran, path):
        gateway = await connect(path)
        first = gateway.run(1, "first")
        await until(lambda: service.core.statistics().table.busy == 1)  # "first" runs
        late = gateway.run(2, "late", timeout=0.05)
        with anyio.fail_after(30):
            done, _ = await asyncio.wait([first, late], return_when=asyncio.FIRST_COMPLETED)
        assert done == {late}, "the deadline waited for the busy worker"
        outcome = late.result()
        assert isinstance(outcome, Rendered) and outcome.status == 504
        with anyio.fail_after(30):
            assert (await first).outputs == ["tsrif"]
        assert ran.read_text().split() == ["first"]


async def test_a_gateway_gone_withdraws_its_queued_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (service, _, ran, path):
        staying, leaving = await connect(path), await connect(path)
        first = staying.run(1, "first")
        await until(lambda: service.core.statistics().table.busy == 1)
        orphans = [leaving.run(rid, f"orphan-{rid}") for rid in range(1, 4)]
        await until(lambda: service.core.statistics().batcher.pending == 3)
        leaving.close()
        for orphan in orphans:  # as a gateway's are, once its link is gone for good
            outcome = await orphan
            assert isinstance(outcome, Rendered) and outcome.status == 503
        await until(lambda: service.core.statistics().batcher.pending == 0)
        with anyio.fail_after(30):
            assert (await first).outputs == ["tsrif"]
            assert (await staying.run(2, "after")).outputs == ["retfa"]
        assert ran.read_text().split() == ["first", "after"]


class Recorder:
    """A transport that keeps what is written, and when (the loop's clock)."""

    def __init__(self) -> None:
        self.frames: list[float] = []

    def write(self, data: bytes) -> None:
        self.frames.append(asyncio.get_running_loop().time())

    def is_closing(self) -> bool:
        return False


def link(busy_rate: float, spacing: float) -> tuple[_CoreConnection, Recorder]:
    conn = _CoreConnection(RemoteCore("", reconnect=False))
    conn.busy_rate, conn.spacing = busy_rate, spacing
    recorder = Recorder()
    conn.connection_made(recorder)  # type: ignore[arg-type]
    return conn, recorder


async def test_a_busy_gateways_frames_to_the_core_are_spaced() -> None:
    conn, sent = link(busy_rate=0.0, spacing=0.05)
    conn.send(("cancel", 1))
    conn.send(("cancel", 2))  # the same turn: the same frame
    await asyncio.sleep(0)
    assert len(sent.frames) == 1
    conn.send(("cancel", 3))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(sent.frames) == 1  # waits for the spacing
    await until(lambda: len(sent.frames) == 2)
    assert sent.frames[1] - sent.frames[0] >= 0.05


async def test_a_quiet_gateway_sends_each_turns_frame_at_once() -> None:
    conn, sent = link(busy_rate=1e9, spacing=0.05)
    for rid in range(3):
        conn.send(("cancel", rid))
        await asyncio.sleep(0)
        assert len(sent.frames) == rid + 1


async def test_an_answered_jobs_deadline_timer_goes_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left armed, every 10 ms slot's timer lived as long as its jobs' timeout."""
    async with core(tmp_path, monkeypatch, tiers()) as (service, door, _, _):
        spawn, _spawned = anyio.create_memory_object_stream[Any](1)
        conn = _GatewayConnection(door, service.clock, {}, spawn)
        sent = Recorder()
        conn.connection_made(sent)  # type: ignore[arg-type]
        conn.received([run_message(rid, Job(WHO, [f"job-{rid}"], True, 60.0))
                       for rid in (1, 2)])
        assert len(conn._deadlines), "a waiting job's deadline is armed"
        await until(lambda: len(sent.frames) >= 1 and not conn._live)  # both answered
        assert not len(conn._deadlines)


class HangUp:
    """A client the test hangs up (`ClientWatch`)."""

    def __init__(self) -> None:
        self.leave: Callable[[], object] | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        self.leave = leave

    def unwatch(self) -> None:
        self.leave = None


async def test_a_gateway_s_job_whose_client_leaves_ends_499_at_once_and_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core answers nothing for a job withdrawn because its client left: the gateway's
    own call must end when the client goes, not wait for an answer that never comes."""
    async with core(tmp_path, monkeypatch, tiers()) as (service, _, ran, path):
        remote = RemoteCore(path, reconnect=False)
        await remote.connect()
        first = asyncio.ensure_future(remote.run(Job(WHO, ["first"], True, 60.0), HangUp()))
        await until(lambda: service.core.statistics().table.busy == 1)  # "first" runs
        client = HangUp()
        left = asyncio.ensure_future(remote.run(Job(WHO, ["left"], True, 60.0), client))
        await until(lambda: service.core.statistics().batcher.pending == 1)
        assert client.leave is not None
        client.leave()
        with anyio.fail_after(5):
            outcome = await left
        assert isinstance(outcome, Rendered) and outcome.status == 499
        assert b"client_closed" in outcome.body
        await until(lambda: service.core.statistics().batcher.pending == 0)  # withdrawn
        with anyio.fail_after(30):
            assert (await first).outputs == ["tsrif"]
        assert ran.read_text().split() == ["first"]
        assert not remote.jobs and not remote.calls


# -- the direct way of a gateway: HTTP in, the job over the link, the answer written back --
EXAMPLE_KEYS = Path(__file__).parents[3] / "examples" / "keys.toml"


async def not_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """Stands for the app: a request that took ASGI's way gets 418, not its answer."""
    if scope["type"] == "http":
        await Response(b"asgi", status_code=418)(scope, receive, send)


@asynccontextmanager
async def gateway_http(path: str) -> AsyncIterator[tuple[int, RemoteCore, Metrics]]:
    """A gateway's HTTP side in this process: uvicorn with `RemoteRoute` over the link."""
    remote = RemoteCore(path, reconnect=False)
    await remote.connect()
    metrics = Metrics()
    routes = Routes(remote, Settings(model="sim"), load_keys(EXAMPLE_KEYS), metrics)
    async with serving(not_asgi, RemoteRoute(routes, remote)) as port:
        yield port, remote, metrics


async def post_to(port: int, text: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        return await client.post("/v1/batchstring", json={"input": text},
                                 headers={"Authorization": "Bearer paid-demo-key"})


def post_soon(tg: TaskGroup, port: int, text: str, into: list[httpx.Response]) -> None:
    """POST `text` in the background; its response joins `into`."""
    async def one() -> None:
        into.append(await post_to(port, text))

    tg.start_soon(one)


async def test_a_gateway_s_direct_way_answers_each_request_with_its_own_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (_, _, ran, path), \
            gateway_http(path) as (port, remote, metrics):
        texts = [f"direct-{i}" for i in range(6)]
        async with anyio.create_task_group() as tg:
            answers: dict[str, httpx.Response] = {}

            async def one(text: str) -> None:
                answers[text] = await post_to(port, text)

            for text in texts:
                tg.start_soon(one, text)
        assert {t: (a.status_code, a.json()["output"]) for t, a in answers.items()} == \
            {t: (200, t[::-1]) for t in texts}
        assert all("queue;dur=" in a.headers["server-timing"] for a in answers.values())
        assert sorted(ran.read_text().split()) == sorted(texts)
        assert not remote.jobs
        await until(lambda: metrics.registry.get_sample_value(
            "batchgate_requests_total",
            {"tier": "paid", "code": "200", "model": "default", "version": "v1"}) == len(texts))


async def test_a_gateway_s_direct_call_whose_client_leaves_is_withdrawn_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (service, _, ran, path), \
            gateway_http(path) as (port, remote, metrics):
        first: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:
            post_soon(tg, port, "first", first)
            await until(lambda: service.core.statistics().table.busy == 1)  # "first" runs
            stream = await anyio.connect_tcp("127.0.0.1", port)
            body = b'{"input": "left"}'
            await stream.send(b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\nAuthorization: "
                              b"Bearer paid-demo-key\r\nContent-Length: %d\r\n\r\n%s"
                              % (len(body), body))
            await until(lambda: service.core.statistics().batcher.pending == 1)
            await stream.aclose()  # hangs up while its job is queued
            await until(lambda: service.core.statistics().batcher.pending == 0)  # withdrawn
        assert first[0].json()["output"] == "tsrif"
        assert ran.read_text().split() == ["first"]
        assert not remote.jobs
        await until(lambda: metrics.registry.get_sample_value(
            "batchgate_requests_total",
            {"tier": "paid", "code": "499", "model": "", "version": ""}) == 1)


async def test_a_gateway_s_direct_call_gets_a_503_when_the_core_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with core(tmp_path, monkeypatch, tiers()) as (service, _, _, path), \
            gateway_http(path) as (port, remote, _):
        answers: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:
            post_soon(tg, port, "first", answers)
            await until(lambda: service.core.statistics().table.busy == 1)
            post_soon(tg, port, "orphan", answers)
            await until(lambda: service.core.statistics().batcher.pending == 1)
            assert remote._conn is not None and remote._conn.transport is not None
            remote._conn.transport.close()  # as when the core process dies
        assert sorted(a.status_code for a in answers) == [503, 503]
        assert all(a.json()["error"]["code"] == "core_unavailable" for a in answers)
        after = await post_to(port, "after")  # the link is gone: refused at once
        assert after.status_code == 503


@asynccontextmanager
async def no_lifespan(app: object) -> AsyncIterator[None]:
    yield


async def test_a_gateway_s_calls_to_a_core_that_stops_answering_end_in_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_module, "CALL_TIMEOUT_S", 0.2)
    path = str(tmp_path / "mute.sock")

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes every frame, answers none, until the gateway hangs up

    server = await asyncio.start_unix_server(mute, path)
    async with server:
        remote = RemoteCore(path, reconnect=False)
        await remote.connect()
        assert remote._conn is not None and remote._conn.transport is not None
        with anyio.fail_after(10):
            assert (await remote.status(StatusCall.READY))["ready"] is False
            with pytest.raises(CoreUnavailable):
                await remote.status(StatusCall.WORKERS)
        assert not remote.calls
        routes = Routes(remote, Settings(model="sim"), load_keys(EXAMPLE_KEYS), Metrics())
        async with serving(http_app(routes, no_lifespan)) as port, httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            workers = await client.get("/admin/workers",
                                       headers={"Authorization": "Bearer admin-demo-key"})
            assert workers.status_code == 503, workers.text
            assert workers.json()["error"]["code"] == "core_unavailable"
            assert workers.headers["retry-after"] == "1"
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/metrics")).status_code == 503
        remote._conn.transport.close()
