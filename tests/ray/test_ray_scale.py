"""The Ray pool grows and shrinks while it serves (issue 26), on the real cluster: actors
added beyond the cluster's room wait, pending, until a node with room joins; a start taken
back is killed before it is ever placed; a retired actor is killed, its slot removed, never
reported dead; and a cell's successor core claims no retired actor, nor one of a slot added
beyond its own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

import ray
from ray.exceptions import RayError

from gpu_pool import CellIdentity, Load, PoolSettings, RayPoolSettings, WorkerId
from gpu_pool.ray_pool import RayPool
from tests.gpu_pool.test_pool import asked
from tests.ray.lab import SLOT, Lab
from tests.ray.test_ray_switch import actor_state, answer, running

pytestmark = pytest.mark.anyio
ROOM = "batchgate_scale_slot"  # held only by the nodes this module adds
SIM = Load("default@v1", "sim", latency_floor=0.0)


def settings(workers: int, resource: str, **kw: Any) -> RayPoolSettings:
    base = PoolSettings(model="sim", workers=workers, latency_floor=0.0, restart_backoff=0.05)
    return RayPoolSettings(base, resources={resource: 1.0}, **kw)


@contextmanager
def nodes_of_our_own(lab: Lab) -> Iterator[list[Any]]:
    """Nodes with room for two workers each in `ROOM`, added with `add_room`, removed after."""
    added: list[Any] = []
    try:
        yield added
    finally:
        for node in added:
            lab.cluster.remove_node(node, allow_graceful=False)


def add_room(lab: Lab, added: list[Any]) -> str:
    node = lab.cluster.add_node(num_cpus=1, resources={ROOM: 2})
    lab.cluster.wait_for_nodes()
    added.append(node)
    return str(node.node_id)


async def gone(pool: RayPool, slot: int) -> None:
    """Wait until slot `slot` has left what the pool reports."""
    with anyio.fail_after(30):
        while any(w.slot == slot for w in pool.workers()):
            await pool._slots.changed().wait()


def named(pool: RayPool) -> set[str]:
    """The live actors named in the pool's namespace."""
    return {e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
            if e["namespace"] == pool._namespace}


async def test_actors_added_beyond_the_room_wait_pending_until_a_node_joins(lab: Lab) -> None:
    with nodes_of_our_own(lab) as added:
        add_room(lab, added)
        pool = RayPool(settings(2, ROOM))
        async with running(pool, 2) as events:
            for n in range(1, 4):
                pool.add(SIM, asked(n))
            with anyio.fail_after(30):  # it returns once the cluster is full
                assert await pool.wait_ready(5, within=600) == 2
            assert pool.state_counts()["pending"] == 3
            assert pool.cancel_start(asked(3))  # slot 4's: never placed
            assert [w.slot for w in pool.workers()] == [0, 1, 2, 3]
            joined = add_room(lab, added)
            await events.wait_for(lambda: len(events.ready) == 4)
            assert {w.node for w in pool.workers() if w.slot >= 2} == {joined}
            assert named(pool) == {f"slot-{i}.1" for i in range(4)}
            assert await answer(pool, events, events.ready[3], "abc") == "cba"
            (retired,) = [w for w in pool.workers() if w.slot == 2]
            pool.retire(WorkerId(retired.id))
            await gone(pool, 2)
            assert actor_state(retired.pid) == "DEAD" and "slot-2.1" not in named(pool)
            assert events.died == [] and pool.crashes == 0 and pool.ready_count() == 3


async def test_an_actor_added_comes_up_for_the_start_the_core_gave_and_stays(lab: Lab) -> None:
    pool = RayPool(settings(1, SLOT))
    async with running(pool, 1) as events:
        pool.add(SIM, asked(1))
        await events.wait_for(lambda: len(events.ready) == 2)
        added = events.ready[1]
        assert (events.starts[added], events.held[added]) == (asked(1), "default@v1")
        assert not pool.cancel_start(asked(1))  # up: nothing to take back
        assert pool.ready_count() == 2 and events.died == []


async def test_a_successor_core_claims_neither_a_retired_actor_nor_an_added_ones(
    lab: Lab,
) -> None:
    cell = f"t{secrets.token_hex(3)}"
    first = RayPool(settings(2, SLOT, cell=CellIdentity(cell, 0)))
    async with running(first, 2) as events:
        first.add(SIM, asked(1))
        await events.wait_for(lambda: len(events.ready) == 3)
        (retired,) = [w for w in first.workers() if w.slot == 1]
        first.retire(WorkerId(retired.id))
        await gone(first, 1)
        kept = {w.slot: w.pid for w in first.workers()}
        (beyond,) = [s.actor for s in first._slots if s.index == 2]
        for slot in first._slots:
            slot.actor = None  # dies abruptly: its stop kills nothing
    second = RayPool(settings(2, SLOT, cell=CellIdentity(cell, 1)))
    async with running(second, 2) as events:
        pids = {w.slot: w.pid for w in second.workers()}
        assert second.attached == 1 and pids[0] == kept[0]  # slot 0's actor, claimed
        assert pids[1] != retired.pid and actor_state(retired.pid) == "DEAD"
        # Slot 2's, beyond the successor's slots, is killed: the first core's sentinel call,
        # which answers only once the actor is no longer its own, fails as it dies.
        with anyio.fail_after(30), pytest.raises(RayError):
            await beyond.sentinel.remote(first._owner)
        assert actor_state(kept[2]) == "DEAD" and events.died == []
