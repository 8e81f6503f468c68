"""The door and the link together: a gateway's jobs settle exactly once, whatever mix of
frames, cancellations, keyed jobs, status calls, worker deaths and a closing link comes.

Everything is real but the pool: a `Door` over the `DispatchCore` its service builds, the
`LinkServer` on a Unix socket, and the gateway's `RemoteCore` with its connection. The pool
holds each batch until the test answers it (a worker may die holding one instead), so the
test decides what is in flight when the next frame, cancel or close comes. The gateway's
connection is tapped: it keeps every message the core sent, by rid.

The property: each job's receiver is answered exactly once (the core's own answer, or the
503 of a lost link), unless the gateway withdrew it first; the core never sends a job or a
call two answers; every answer carries the job's own outputs or an error. The last tests
are the core's side owning its tasks: a call that names nothing or raises is answered
with an error, and the link serves on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from anyio.abc import TaskStatus
from hypothesis import given, settings
from hypothesis import strategies as st

from api.cell import LinkServer
from api.config import DEFAULT_TIERS, KeyRing, Principal, Settings, TierPolicy, Workers, load_keys
from api.door import Service, build_door
from api.errors import CoreUnavailable
from api.gateway import RemoteCore, outcome_of
from api.gateway.frames import Message
from api.gateway.remote import _CoreConnection
from api.http import Answered, Job, Outcome, Rendered, Routes, StatusCall, http_app
from api.metrics import Metrics
from batcher import Tier
from gpu_pool import DEFAULT_VERSION, Err, Ok, Origin, PoolEvents, Run, StartId, WorkerId
from tests.fake_pools import ReportsWorkers

ROOMY = 1e9
LONG_S, SHORT_S = 30.0, 0.03
CALLERS = [  # two keys of one paid account, a free key whose rate runs out, anonymous
    Principal(Tier.PAID, "acme", "paid-1"),
    Principal(Tier.PAID, "acme", "paid-2"),
    Principal(Tier.FREE, "hobby", "free-1"),
    Principal(Tier.FREE, "anonymous", None),
]
TEXTS = ["a", "bc", "de", "boom"]  # the pool's model raises on "boom"
EXAMPLE_KEYS = Path(__file__).parents[3] / "examples" / "keys.toml"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tiers() -> dict[Tier, TierPolicy]:
    """Paid past any example's load; free allows a burst of 2 a key, then refuses."""
    paid = dataclasses.replace(DEFAULT_TIERS[Tier.PAID], rate=ROOMY, burst=ROOMY,
                               account_rate=ROOMY, account_burst=ROOMY, budget_ms=ROOMY)
    free = dataclasses.replace(DEFAULT_TIERS[Tier.FREE], rate=0.01, burst=2,
                               account_rate=ROOMY, account_burst=ROOMY, budget_ms=ROOMY)
    return {Tier.PAID: paid, Tier.FREE: free}


class HeldPool(ReportsWorkers):
    """`gpu_pool.Pool` whose workers hold each batch until `reply_all` (or, once `auto`,
    answer it in the next loop turn); each answers its inputs reversed and raises on a batch
    holding "boom". A worker that dies is replaced at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.auto = False
        self.held: dict[WorkerId, Run | None] = {}  # alive workers, and the batch each holds
        self._ids = itertools.count(1)
        self._events: PoolEvents | None = None
        self.deaths = 0

    async def run(self, events: PoolEvents, *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._events = events
        for index in range(self.size):
            self._start(StartId(Origin.FIRST, index))
        task_status.started()
        await anyio.sleep_forever()

    async def wait_ready(self, count: int, within: float) -> int:
        return self.ready_count()

    def send(self, worker: WorkerId, run: Run) -> None:
        if worker not in self.held:
            return  # its death is already reported
        assert self.held[worker] is None, f"worker {worker} got a batch while busy"
        self.held[worker] = run
        if self.auto:
            asyncio.get_running_loop().call_soon(self._reply, worker, run)

    def kill(self, worker: WorkerId) -> None:
        self._die(worker)

    def reply_all(self) -> None:
        for worker, run in list(self.held.items()):
            if run is not None:
                self._reply(worker, run)

    def die_busy(self) -> None:
        """The first worker holding a batch dies with it."""
        busy = [w for w, run in self.held.items() if run is not None]
        if busy:
            self._die(busy[0])

    def holding(self) -> dict[WorkerId, Run | None]:
        return self.held

    @property
    def crashes(self) -> int:
        return self.deaths

    def _start(self, start: StartId) -> None:
        assert self._events is not None
        worker = WorkerId(next(self._ids))
        self.held[worker] = None
        self._events.worker_ready(worker, start, DEFAULT_VERSION)

    def _reply(self, worker: WorkerId, run: Run) -> None:
        if self.held.get(worker) is not run:
            return  # it died since
        assert self._events is not None
        self.held[worker] = None
        if "boom" in run.inputs:
            self._events.worker_reply(worker, Err(run.batch_id, "model", "ValueError", "boom"))
        else:
            outputs = tuple(text[::-1] for text in run.inputs)
            self._events.worker_reply(worker, Ok(run.batch_id, outputs, 0.001))

    def _die(self, worker: WorkerId) -> None:
        if self.held.pop(worker, "gone") == "gone":
            return
        assert self._events is not None
        self.deaths += 1
        restart = StartId(Origin.RESTART, worker)
        self._events.worker_died(worker, DEFAULT_VERSION, restart)
        self._start(restart)


class Tap(_CoreConnection):
    """A gateway's connection that keeps every message the core sent, by rid, and says
    when one came or the link was lost."""

    spacing = 0.0  # each loop turn's messages leave as one frame, at once

    def __init__(self, core: RemoteCore) -> None:
        super().__init__(core)
        self.wire: dict[int, list[Message]] = defaultdict(list)
        self.lost = False
        self.changed = asyncio.Event()

    def received(self, messages: list[Message]) -> None:
        for message in messages:
            self.wire[message[1]].append(message)
        super().received(messages)
        self.changed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost = True
        self.changed.set()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Returns once `condition` holds; it is read again whenever a frame comes."""
        while not condition():
            self.changed.clear()
            await self.changed.wait()


class Got:
    """The receiver of one job (`api.gateway.Receiver`): keeps every answer it gets."""

    def __init__(self, tap: Tap) -> None:
        self.answers: list[Outcome] = []
        self._tap = tap

    def answered(self, outcome: Outcome) -> None:
        self.answers.append(outcome)
        self._tap.changed.set()


@dataclasses.dataclass
class Cell:
    """A core (door, link server) with a held pool, and one gateway connected to it."""

    service: Service
    pool: HeldPool
    metrics: Metrics
    remote: RemoteCore
    tap: Tap


@asynccontextmanager
async def cell(status: Callable[[], dict[str, Any]] | None = None
               ) -> AsyncIterator[Cell]:
    """The core's parts in this process and a tapped gateway; on the way out the core
    drains, which ends only once every job it took is answered or withdrawn."""
    pool, metrics = HeldPool(2), Metrics()
    settings = Settings(model="sim", workers=Workers(2), max_wait_ms=1, batch_latency_ms=1)
    service, door, view, _ = build_door(settings, KeyRing({}, frozenset(), tiers=tiers()),
                                     metrics, pool=pool, cell=status)
    server = LinkServer(door, service.clock, view.table)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "link.sock")
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)
            await tg.start(server.serve, path)
            remote = RemoteCore(path, reconnect=False)
            _, tap = await asyncio.get_running_loop().create_unix_connection(
                lambda: Tap(remote), path)
            remote._conn = tap  # the gateway's own connection, tapped
            yield Cell(service, pool, metrics, remote, tap)
            if tap.transport is not None:
                tap.transport.close()
            pool.auto = True
            pool.reply_all()
            server.close()
            with anyio.fail_after(10):
                await service.drain()
            stats = service.core.statistics()
            assert stats.batcher.pending == 0 and stats.table.busy == 0, stats
            tg.cancel_scope.cancel()


# -- what an example does ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Submit:
    caller: int
    texts: tuple[str, ...]
    key: str | None  # its Idempotency-Key, if any
    short: bool  # a timeout that may pass while it waits


@dataclasses.dataclass(frozen=True)
class Withdraw:
    which: int  # of the jobs submitted so far (modulo their number)


@dataclasses.dataclass(frozen=True)
class Call:
    name: str


@dataclasses.dataclass(frozen=True)
class Frame:
    """What the gateway sends during one loop turn: one frame."""

    messages: tuple[Submit | Withdraw | Call, ...]


class Reply:
    """The pool answers every batch it holds."""


class Die:
    """A worker holding a batch dies."""


class Settle:
    """A status call's round trip: the core has read every earlier frame."""


class Expire:
    """Every short job still waiting is answered: its deadline passes (the core answers
    504, or refused it before). Waits on the answers, held batches or not."""


Step = Frame | Reply | Die | Settle | Expire

submits = st.builds(Submit, st.integers(0, len(CALLERS) - 1),
                    st.lists(st.sampled_from(TEXTS), min_size=1, max_size=3).map(tuple),
                    st.sampled_from([None, "k1", "k2"]), st.booleans())
messages = st.one_of(submits, submits, submits, st.builds(Withdraw, st.integers(0, 50)),
                     st.builds(Call, st.sampled_from(["ready", "workers", "nope"])))
steps = st.one_of(
    st.builds(Frame, st.lists(messages, min_size=1, max_size=8).map(tuple)),
    st.builds(Frame, st.lists(messages, min_size=1, max_size=8).map(tuple)),
    st.just(Reply()), st.just(Die()), st.just(Settle()), st.just(Expire()),
)


@dataclasses.dataclass
class Sent:
    """What the gateway sent, to check the answers against."""

    jobs: dict[int, tuple[Job, Got]] = dataclasses.field(default_factory=dict)
    withdrawn: set[int] = dataclasses.field(default_factory=set)
    calls: dict[int, tuple[str, asyncio.Future[Any]]] = dataclasses.field(default_factory=dict)


CALL_IDS = itertools.count(10**9)  # a raw call's rid: never one of RemoteCore's


def raw_call(c: Cell, name: str) -> tuple[int, asyncio.Future[Any]]:
    """A status call by any name, as `RemoteCore` makes one by a known name."""
    rid = next(CALL_IDS)
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    c.remote.calls[rid] = future
    c.tap.send(("call", rid, name))
    return rid, future


def send_frame(c: Cell, frame: Frame, sent: Sent) -> None:
    """Every message of `frame` in this one loop turn."""
    for message in frame.messages:
        if isinstance(message, Submit):
            caller = CALLERS[message.caller]
            key = message.key if caller.key is not None else None
            idempotency = None if key is None else (key, repr(message.texts).encode())
            job = Job(caller, list(message.texts), len(message.texts) == 1,
                      SHORT_S if message.short else LONG_S, idempotency)
            got = Got(c.tap)
            sent.jobs[c.remote.submit(job, got)] = (job, got)
        elif isinstance(message, Withdraw) and sent.jobs:
            rid = list(sent.jobs)[message.which % len(sent.jobs)]
            if rid in c.remote.jobs:  # not answered yet: its client leaves
                sent.withdrawn.add(rid)
            c.remote.withdraw(rid)
        elif isinstance(message, Call):
            rid, future = raw_call(c, message.name)
            sent.calls[rid] = (message.name, future)


async def play(story: list[Step], close_early: bool) -> tuple[Sent, Tap]:
    sent = Sent()
    with anyio.fail_after(20):  # a safety net: every wait here is for an answer
        async with cell() as c:
            for step in story:
                if isinstance(step, Frame):
                    send_frame(c, step, sent)
                    await asyncio.sleep(0)  # the frame leaves
                elif isinstance(step, Reply):
                    c.pool.reply_all()
                elif isinstance(step, Die):
                    c.pool.die_busy()
                elif isinstance(step, Settle):
                    assert (await c.remote.status(StatusCall.READY))["ready"] is True
                else:
                    await c.tap.wait_until(lambda: all(
                        got.answers for rid, (job, got) in sent.jobs.items()
                        if job.timeout == SHORT_S and rid not in sent.withdrawn))
            if not close_early:  # let everything be answered before the link closes
                c.pool.auto = True
                c.pool.reply_all()
                await c.tap.wait_until(lambda: all(
                    got.answers for rid, (_, got) in sent.jobs.items()
                    if rid not in sent.withdrawn)
                    and all(f.done() for _, f in sent.calls.values()))
            assert c.tap.transport is not None
            c.tap.transport.close()  # the link closes: nothing more can come
            await c.tap.wait_until(lambda: c.tap.lost)
    return sent, c.tap


def check_own_answer(job: Job, outcome: Outcome) -> None:
    """An answer carries the job's own outputs, or an error that is no hang-up."""
    expected = [text[::-1] for text in job.texts]
    if isinstance(outcome, Answered):
        assert outcome.outputs == expected
    elif outcome.status == 200:  # a keyed job's answer, or its replay
        body = orjson.loads(outcome.body)
        assert (body["output"] if job.single else body["outputs"]) \
            == (expected[0] if job.single else expected)
    else:
        assert outcome.status in (422, 429, 500, 503, 504), outcome


def check_settled_once(sent: Sent, tap: Tap, close_early: bool) -> None:
    for rid, (job, got) in sent.jobs.items():
        wire = tap.wire.get(rid, [])
        assert len(wire) <= 1, f"job {rid} answered twice by the core: {wire}"
        if rid in sent.withdrawn:
            assert got.answers == [], f"withdrawn job {rid} answered at the gateway"
            continue
        assert len(got.answers) == 1, f"job {rid} settled {len(got.answers)} times"
        (outcome,) = got.answers
        if wire:
            assert outcome == outcome_of(wire[0])
            check_own_answer(job, outcome)
        else:  # lost with the link
            assert close_early and isinstance(outcome, Rendered) and outcome.status == 503
            assert b"core_unavailable" in outcome.body
    for rid, (name, future) in sent.calls.items():
        wire = tap.wire.get(rid, [])
        assert len(wire) <= 1 and future.done(), f"call {rid}: {wire}"
        assert wire or close_early
        if name == "nope" or not wire:
            assert isinstance(future.exception(), CoreUnavailable)
        else:
            assert future.result() is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(steps, min_size=1, max_size=16), st.booleans())
def test_every_job_of_a_gateway_is_settled_exactly_once(
    story: list[Step], close_early: bool
) -> None:
    sent, tap = anyio.run(play, story, close_early, backend="asyncio")
    check_settled_once(sent, tap, close_early)


# -- the core's side owns its tasks ------------------------------------------------------------
async def still_serving(c: Cell) -> None:
    """The link answers a status call and runs a job after what went before."""
    assert (await c.remote.status(StatusCall.READY))["ready"] is True
    got = Got(c.tap)
    c.remote.submit(Job(CALLERS[0], ["after"], True, LONG_S), got)
    c.pool.auto = True
    c.pool.reply_all()
    await c.tap.wait_until(lambda: bool(got.answers))
    assert isinstance(got.answers[0], Answered) and got.answers[0].outputs == ["retfa"]


@pytest.mark.anyio
async def test_a_call_naming_no_known_call_is_answered_with_an_error() -> None:
    async with cell() as c:
        with anyio.fail_after(5):
            with pytest.raises(CoreUnavailable, match="LookupError"):
                await raw_call(c, "nope")[1]
            await still_serving(c)


def broken() -> dict[str, Any]:
    raise RuntimeError("the supervisor's table is broken")


@pytest.mark.anyio
async def test_a_call_that_raises_is_answered_with_an_error_and_the_link_serves_on() -> None:
    async with cell(status=broken) as c:
        with anyio.fail_after(5):
            with pytest.raises(CoreUnavailable, match="RuntimeError in 'cell'"):
                await c.remote.status(StatusCall.CELL)
            assert len(await c.remote.status(StatusCall.WORKERS)) == 2
            await still_serving(c)


@asynccontextmanager
async def no_lifespan(app: object) -> AsyncIterator[None]:
    yield


@pytest.mark.anyio
async def test_a_route_whose_core_call_raised_answers_503() -> None:
    async with cell(status=broken) as c:
        routes = Routes(c.remote, Settings(model="sim"), load_keys(EXAMPLE_KEYS), Metrics())
        transport = httpx.ASGITransport(app=http_app(routes, no_lifespan))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            with anyio.fail_after(5):
                r = await client.get("/admin/workers",
                                     headers={"Authorization": "Bearer admin-demo-key"})
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "core_unavailable"
                await still_serving(c)


@pytest.mark.anyio
async def test_a_keyed_job_served_over_the_link_counts_no_refusal() -> None:
    async with cell() as c:
        got = Got(c.tap)
        c.remote.submit(Job(CALLERS[0], ["a"], True, LONG_S, ("k", b"digest")), got)
        c.pool.auto = True
        c.pool.reply_all()
        with anyio.fail_after(5):
            await c.tap.wait_until(lambda: bool(got.answers))
        assert isinstance(got.answers[0], Rendered) and got.answers[0].status == 200
        assert not c.metrics.registry.get_sample_value(
            "batchgate_rejected_total", {"tier": "paid", "reason": "core_unavailable"})
