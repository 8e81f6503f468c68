"""The service: the dispatch core built from the settings, its readiness and pressure, and
its run and drain over a fake pool (on asyncio's clock, the service's own)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from api.config import DEFAULT_TIERS, Settings, Workers
from api.door import (
    Service,
    StatusView,
    check_core_settings,
    core_settings,
    hang_settings,
    latency_floor,
)
from api.metrics import Metrics
from batcher import Closed, FlushPolicy, Item, ItemId, Tier, VersionKey
from gpu_pool import WorkerInfo
from tests.api.door.fakes import FakePool, Waiter

IDS = itertools.count(1)
SETTINGS = Settings(workers=Workers(1), batch_latency_ms=100, max_wait_ms=1, ready_timeout_s=5)


def service_over(pool: FakePool, settings: Settings = SETTINGS) -> Service:
    return Service(settings, Metrics(), DEFAULT_TIERS, pool=pool)


def admit(service: Service, *texts: str) -> Waiter:
    """A paid request of `texts`, admitted straight into the service's core."""
    waiter, now = Waiter(len(texts)), service.clock.now()
    service.core.admit([Item(ItemId(next(IDS)), t, Tier.PAID, now, now + 10, waiter, n)
                        for n, t in enumerate(texts)], 10.0)
    return waiter


@asynccontextmanager
async def running(service: Service) -> AsyncIterator[Service]:
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(service.run)
            yield service
        tg.cancel_scope.cancel()


# -- the core, from the settings --------------------------------------------------------------
def test_the_core_takes_its_policy_capacity_attempts_and_budgets_from_the_settings() -> None:
    settings = Settings(max_batch=40, max_wait_ms=20, idle_trigger=False, queue_capacity=500,
                        max_attempts=3, batch_latency_ms=80)
    built = core_settings(settings, DEFAULT_TIERS)
    assert built.policy == FlushPolicy(max_batch=40, max_wait=0.02, idle_trigger=False)
    assert (built.queue_capacity, built.max_attempts, built.initial_latency) == (500, 3, 0.08)
    assert built.budgets == {Tier.PAID: 0.4, Tier.FREE: 0.25}


@pytest.mark.parametrize(("model", "flag_ms", "floor"), [
    ("sim", None, 0.1),  # the contract's fixed latency
    ("minilm", None, 0.0),
    ("tests.models:counting", None, 0.0),
    ("sim", 20.0, 0.02),  # the flag's, whatever the model's
])
def test_the_latency_floor_is_the_flags_else_the_models_own(
    model: str, flag_ms: float | None, floor: float
) -> None:
    assert latency_floor(Settings(model=model, batch_latency_ms=flag_ms)) == floor


@pytest.mark.parametrize("flag_ms", [None, 0.0])
def test_until_a_batch_is_measured_admission_assumes_at_least_10_ms(flag_ms: float | None
                                                                      ) -> None:
    settings = Settings(model="minilm", batch_latency_ms=flag_ms)
    assert core_settings(settings, DEFAULT_TIERS).initial_latency == 0.01


def test_hang_settings_hedge_after_the_flag_and_kill_after_the_hang_timeout() -> None:
    hang = hang_settings(Settings(hedge_after_ms=250, hang_timeout_ms=2000))
    assert (hang.hedge, hang.hedge_floor, hang.kill_after) == (True, 0.25, 2.0)
    unset = hang_settings(Settings(hedge_after_ms=0))
    assert (unset.hedge, unset.kill_after) == (False, None)  # no hedging; a learned limit


@pytest.mark.parametrize(("settings", "says"), [
    (Settings(model="no such model"),
     "expected 'minilm', 'minilm-guard', 'sim' or 'module:function'"),
    (Settings(model="pkg.mod:"), "module:function"),
    (Settings(ray_worker_resources="GPU=zero"), "'zero' is not a number"),
    (Settings(ray_worker_resources=" , "), "name at least one resource"),
])
def test_check_core_settings_refuses_a_bad_model_or_ray_resources(settings: Settings,
                                                                   says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_core_settings(settings)


def test_check_core_settings_accepts_a_builtin_model_or_a_function_and_named_resources() -> None:
    check_core_settings(Settings(model="sim", ray_worker_resources="batchgate_slot, CPU=2"))
    check_core_settings(Settings(model="tests.models:counting"))


# -- run, readiness, pressure, drain (asyncio: the service's clock is the loop's) -------------
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_service_reports_started_only_once_its_workers_are_ready() -> None:
    pool = FakePool(up=False)
    service, started = service_over(pool), anyio.Event()

    async def start() -> None:
        await tg.start(service.run)
        started.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await anyio.wait_all_tasks_blocked()
        assert not started.is_set() and not service.ready()
        pool.bring_up()
        with anyio.fail_after(5):
            await started.wait()
        assert service.ready()
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_service_whose_workers_never_come_up_fails_loudly() -> None:
    settings = Settings(workers=Workers(1), ready_timeout_s=0.05)
    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            await tg.start(service_over(FakePool(up=False), settings).run)
    assert caught.group_contains(RuntimeError, match="no worker became ready within")


@pytest.mark.anyio
async def test_pressure_is_the_expected_wait_over_the_tiers_budget() -> None:
    service = service_over(FakePool())
    # No worker up yet: the first ones are on their way, at a load's ETA (30 s, unmeasured)
    assert service.pressure(Tier.FREE) == pytest.approx((30.0 + 0.1) / 0.25, abs=0.2)
    assert service.snapshot().tier_gauges["estimated_wait_seconds"]["free"] == \
        pytest.approx(30.1, abs=0.05)
    async with running(service):
        # nothing queued: one batch of 100 ms, against 250 ms (free) and 400 ms (paid)
        assert service.pressure(Tier.FREE) == pytest.approx(0.4)
        assert service.pressure(Tier.PAID) == pytest.approx(0.25)


@pytest.mark.anyio
async def test_a_leaving_service_says_not_ready_while_it_still_serves() -> None:
    service = service_over(FakePool())
    status = StatusView(service, service.pool.ready_count, Metrics())
    async with running(service):
        assert await status.ready() == {"ready": True, "workers_ready": 1, "draining": False}
        service.leave()
        assert await status.ready() == {"ready": False, "workers_ready": 1, "draining": True}
        assert not service.draining
        waiter = admit(service, "still")
        await waiter.wait()
    assert waiter.outputs == ["llits"]


@pytest.mark.anyio
async def test_drain_refuses_new_items_and_returns_once_queued_and_running_ones_are_answered(
) -> None:
    pool = FakePool()
    service = service_over(pool)
    async with running(service):
        pool.hold()
        running_now = admit(service, "ab", "cd")
        await pool.wait_batches(1)
        queued = admit(service, "ef")  # behind the busy worker
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.drain)
            await anyio.wait_all_tasks_blocked()
            assert service.draining and not service.ready()
            with pytest.raises(Closed):
                admit(service, "late")
            pool.release()
    assert (running_now.outputs, queued.outputs) == (["ba", "dc"], ["fe"])


class HoldingB(FakePool):
    """Every worker holds `b@v1`: the first model, `a`, has gone cold (idle, min_workers 0)."""

    def workers(self) -> list[WorkerInfo]:
        return [WorkerInfo(w, w, None, "ready", "cpu", 0, 0, version=VersionKey.parse("b@v1"))
                for w in range(self.size)]


def test_a_first_model_gone_cold_leaves_the_server_ready(tmp_path: Path) -> None:
    """A request without `model` would load `a` onto a worker: it can serve (a balancer
    that took the server out would keep that request away for good)."""
    models = tmp_path / "models.toml"
    models.write_text('[models.a]\nmin_workers = 0\n[models.a.versions.v1]\nspec = "sim"\n'
                      '[models.b]\n[models.b.versions.v1]\nspec = "sim"\n')
    service = service_over(HoldingB(2), Settings(models=str(models), workers=Workers(2)))
    assert service.ready()
    service.leave()
    assert not service.ready()


def test_a_server_with_no_worker_up_is_not_ready() -> None:
    assert not service_over(FakePool(up=False)).ready()
