"""The Ray pool driven directly through the pool seam, on the real cluster: each incarnation
is one actor on a worker node, answers in order, is held to the contract, and its death is
reported once and repaired under a new id."""

from __future__ import annotations

import secrets
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

import gpu_pool.ray_pool
from batcher.tracing import format_traceparent
from gpu_pool import (
    DEFAULT_VERSION,
    BatchId,
    CellIdentity,
    Err,
    Ok,
    Origin,
    PoolSettings,
    RayPoolSettings,
    Run,
    StartId,
    StartKind,
    WorkerId,
)
from gpu_pool.ray_cluster import lost_nodes
from gpu_pool.ray_pool import RayPool
from tests.e2e.test_traces import receiving
from tests.gpu_pool.test_pool import Events
from tests.ray.lab import SLOT, Lab, kill_actor

pytestmark = pytest.mark.anyio
TRACE, ATTEMPT = 0x5EED, 0xA7


@asynccontextmanager
async def ray_pool(
    model: str, workers: int = 1, events: Events | None = None,
    otlp_endpoint: str | None = None, cell: CellIdentity | None = None,
) -> AsyncIterator[tuple[RayPool, Events]]:
    events = events or Events()
    base = PoolSettings(model=model, workers=workers, restart_backoff=0.05,
                        otlp_endpoint=otlp_endpoint)
    pool = RayPool(RayPoolSettings(base, resources={SLOT: 1.0}, cell=cell))
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) >= workers)
        yield pool, events
        tg.cancel_scope.cancel()


async def test_an_actor_on_a_worker_node_answers_a_batch_in_order(lab: Lab) -> None:
    async with ray_pool("sim") as (pool, events):
        (worker,) = events.ready
        pool.send(worker, Run(BatchId(1), ("abc", "de", "f")))
        await events.wait_for(lambda: events.replies)
        ((replier, reply),) = events.replies
        assert replier == worker and isinstance(reply, Ok)
        assert (reply.batch_id, reply.outputs) == (BatchId(1), ("cba", "ed", "f"))
        (info,) = pool.workers()
        assert info.node in lab.worker_nodes() and info.state == "ready"
        assert info.batches == 1 and info.device == "cpu"


async def test_a_traced_batch_sends_the_actors_worker_run_span_under_its_attempt(
    lab: Lab,
) -> None:
    traced = Run(BatchId(1), ("ab", "cd"), None,
                 (format_traceparent(TRACE, ATTEMPT), format_traceparent(TRACE + 1, ATTEMPT + 1)))
    with receiving() as otlp:
        async with ray_pool("sim", otlp_endpoint=otlp.url) as (pool, events):
            (worker,) = events.ready
            pool.send(worker, Run(BatchId(2), ("untraced",)))
            await events.wait_for(lambda: len(events.replies) == 1)
            pool.send(worker, traced)
            await events.wait_for(lambda: len(events.replies) == 2)
            (info,) = pool.workers()
            spans = await otlp.wait_for(lambda got: len(got) >= 2)
    assert [reply.outputs for _, reply in events.replies if isinstance(reply, Ok)] == \
        [("decartnu",), ("ba", "dc")]
    got = {(s.trace_id, s.parent) for s in spans}
    assert got == {(f"{TRACE:032x}", f"{ATTEMPT:016x}"),
                   (f"{TRACE + 1:032x}", f"{ATTEMPT + 1:016x}")}  # none for the untraced
    assert {(s.name, s.process, s.attributes["process.pid"], s.attributes["batchgate.batch_id"])
            for s in spans} == {("worker.run", "worker", info.pid, 1)}


async def test_a_later_core_that_claims_the_actor_has_its_spans_sent_to_its_own_endpoint(
    lab: Lab,
) -> None:
    cell, traced = f"t{secrets.token_hex(3)}", (format_traceparent(TRACE, ATTEMPT),)
    with receiving() as first_otlp, receiving() as second_otlp:
        async with ray_pool("sim", otlp_endpoint=first_otlp.url,
                            cell=CellIdentity(cell, 1)) as (first, events):
            (worker,) = events.ready
            first.send(worker, Run(BatchId(1), ("a",), None, traced))
            await events.wait_for(lambda: events.replies)
            before = await first_otlp.wait_for(bool)
            async with ray_pool("sim", otlp_endpoint=second_otlp.url,
                                cell=CellIdentity(cell, 2)) as (second, events):
                assert second.attached == 1  # the first core's actor, claimed
                (worker,) = events.ready
                second.send(worker, Run(BatchId(2), ("b",), None, traced))
                await events.wait_for(lambda: events.replies)
                after = await second_otlp.wait_for(bool)
    assert [s.attributes["batchgate.batch_id"] for s in before] == [1]
    assert [s.attributes["batchgate.batch_id"] for s in after] == [2]
    assert len(first_otlp.spans) == 1  # nothing of the second core's went to the first's


async def test_the_contract_is_checked_and_a_model_error_leaves_the_actor_alive(
    lab: Lab,
) -> None:
    async with ray_pool("tests.models:poison") as (pool, events):
        (worker,) = events.ready
        pool.send(worker, Run(BatchId(1), ("fine", "POISON")))
        await events.wait_for(lambda: len(events.replies) == 1)
        pool.send(worker, Run(BatchId(2), ("fine",)))
        await events.wait_for(lambda: len(events.replies) == 2)
        (_, error), (_, ok) = events.replies
        assert isinstance(error, Err) and (error.kind, error.error_type) == ("model", "ValueError")
        assert isinstance(ok, Ok) and ok.outputs == ("enif",)
    async with ray_pool("tests.models:short_by_one") as (pool, events):
        pool.send(events.ready[0], Run(BatchId(3), ("a", "b")))
        await events.wait_for(lambda: events.replies)
        assert isinstance(reply := events.replies[0][1], Err) and reply.kind == "contract"
    assert events.died == []


async def test_a_hung_actor_killed_is_reported_dead_once_and_replaced_under_a_new_id(
    lab: Lab,
) -> None:
    async with ray_pool("tests.models:hang_on_marker") as (pool, events):
        (first,) = events.ready
        pool.send(first, Run(BatchId(1), ("HANG",)))
        pool.kill(first)  # what the hang watchdog does
        await events.wait_for(lambda: len(events.ready) == 2)
        second = events.ready[1]
        pool.send(second, Run(BatchId(2), ("x",)))
        await events.wait_for(lambda: events.replies)
        assert events.died == [first] and second != first
        assert [w for w, _ in events.replies] == [second]  # nothing from the old one
        assert pool.crashes == 1 and pool.workers()[0].restarts == 1


async def test_an_idle_actor_killed_from_outside_is_seen_dead_at_once(lab: Lab) -> None:
    async with ray_pool("sim") as (pool, events):
        (first,) = events.ready
        (info,) = pool.workers()
        assert info.pid is not None
        kill_actor(info.pid)  # no batch pending: only its sentinel call can tell
        await events.wait_for(lambda: len(events.ready) == 2)
        assert events.died == [first]


async def test_an_actor_that_crashes_mid_batch_is_reported_dead_once(lab: Lab) -> None:
    async with ray_pool("tests.models:crash_on_marker") as (pool, events):
        (first,) = events.ready
        pool.send(first, Run(BatchId(1), ("CRASH",)))
        await events.wait_for(lambda: len(events.ready) == 2)
        assert events.died == [first] and events.replies == []


async def test_an_actor_killed_once_up_is_restarted_under_a_start_named_for_it(
    lab: Lab,
) -> None:
    async with ray_pool("sim") as (pool, events):
        (first,) = events.ready
        assert (events.starts[first], events.held[first]) == (
            StartId(Origin.FIRST, 0), DEFAULT_VERSION)
        pool.kill(first)
        await events.wait_for(lambda: len(events.ready) == 2)
        restart = StartId(Origin.RESTART, first)
        assert events.restarts == {first: restart} and events.lost[first] == DEFAULT_VERSION
        assert events.starts[events.ready[1]] == restart


class UpWatch(Events):
    """Also notes how many workers were reported up at each death, and tells another
    thread when one comes up (`up`)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = threading.Event()
        self.up_at_death: list[int] = []

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        super().worker_ready(worker, start, version)
        self.up.set()

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        self.up_at_death.append(len(self.ready))
        super().worker_died(worker, version, restart)


async def test_a_death_is_reported_before_its_restart_comes_up_however_long_its_node_check(
    lab: Lab, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Were the restart up first, the core would see the start end before it began.
    events = UpWatch()

    def lingering(suspects: set[str]) -> set[str]:
        events.up.wait(5)  # Ray's control plane, slow to answer: until a worker is up
        return set()

    monkeypatch.setattr(gpu_pool.ray_pool, "_lost_nodes", lingering)
    monkeypatch.setattr(gpu_pool.ray_pool, "NODE_CHECK_S", 30.0)
    async with ray_pool("sim", events=events) as (pool, _):
        (first,) = events.ready
        events.up.clear()
        pool.kill(first)
        await events.wait_for(lambda: len(events.ready) == 2)
        assert events.up_at_death == [1]  # its death came first
        assert events.starts[events.ready[1]] == events.restarts[first]


class DeathWatch(Events):
    """Also notes, at each death reported, the nodes of the workers the pool calls up."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: RayPool | None = None
        self.up_nodes: list[set[str]] = []

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        assert self.pool is not None
        self.up_nodes.append({w.node for w in self.pool.workers()
                              if w.state in ("ready", "busy")})
        super().worker_died(worker, version, restart)


async def test_a_lost_nodes_actors_are_reported_dead_together(lab: Lab) -> None:
    # Were one reported alone, the core could re-route its batch to the other, dead too.
    events = DeathWatch()
    base = PoolSettings(model="sim", workers=4, restart=False)
    events.pool = pool = RayPool(RayPoolSettings(base, resources={SLOT: 1.0}))
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) == 4)
        lost = pool.workers()[0].node
        lab.remove_node(lost)
        await events.wait_for(lambda: len(events.died) == 2)
        assert all(lost not in up for up in events.up_nodes)
        assert {w.node for w in pool.workers() if w.state == "dead"} == {lost}
        assert set(events.restarts.values()) == {None}  # `restart=False`: none starts again
        tg.cancel_scope.cancel()
    lab.add_node()  # the cluster as the other tests expect it


def test_a_lost_node_is_known_by_its_raylet_before_rays_verdict(lab: Lab) -> None:
    # Ray declares the node dead after missed health checks (~1.5 s here, ~15 s by
    # default); a busy machine delays that verdict past the pool's node check.
    lost, kept = lab.worker_nodes()
    suspects = {lost, kept}  # the dead nodes of earlier tests aside
    assert lost_nodes(suspects) & suspects == set()
    lab.remove_node(lost)
    assert lost_nodes(suspects) & suspects == {lost}  # at once, and the live one is not


async def test_workers_beyond_the_clusters_room_wait_pending(lab: Lab) -> None:
    room = len(lab.worker_nodes()) * 2
    events = Events()
    base = PoolSettings(model="sim", workers=room + 1)
    pool = RayPool(RayPoolSettings(base, resources={SLOT: 1.0}))
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        with anyio.fail_after(30):  # it returns once the cluster is full, not at `within`
            assert await pool.wait_ready(room + 1, within=600) == room
        assert pool.state_counts()["pending"] == 1
        tg.cancel_scope.cancel()
    assert {w.state for w in pool.workers()} == {"stopped"}
