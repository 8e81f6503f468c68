"""The keyed path: a request with an Idempotency-Key runs once per account. Whatever its
leader's answer is, every request that joined it gets that answer; only what running the
request decided (2xx, 400, 413, 422) is kept for the requests that come after it, and a
leader that ends with no answer of its own (its client left) sends its joiners to retry.

Driven through the door (`Door.run`) over a core that queues what it admits until the test
answers or fails it, and through `KeyedPath` alone over a `serve` the test settles.
"""

from __future__ import annotations

from dataclasses import replace

import anyio
import anyio.lowlevel
import orjson
import pytest
from anyio.abc import TaskGroup

from api.config import Principal, TierPolicy
from api.door import Door, KeptRequest, KeyedPath, RateLimiter, is_kept
from api.errors import ApiError, RateLimited, to_api_error
from api.http import Answered, ClientWatch, Job, Outcome, Rendered, rendered
from api.kept import MemoryIdempotencyStore
from api.metrics import Metrics
from batcher import (
    BatchgateError,
    DeadlineExceeded,
    Item,
    ItemId,
    MonotonicClock,
    OverBudget,
    Tier,
)
from failover import ModelError, ShuttingDown, WorkerCrashed
from tests.api.door.fakes import ONE_VERSION, REPLAYED, ROOMY, Client, QueueCore, keyed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # a request waits on an asyncio future (`PendingRequest`)


def door_over(core: QueueCore, tiers: dict[Tier, TierPolicy] = ROOMY) -> Door:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    return Door(core, MonotonicClock(), RateLimiter(tiers), store, lambda tier: 0.0, Metrics())


def start(tg: TaskGroup, door: Door, job: Job, client: ClientWatch | None = None
          ) -> list[Rendered]:
    """Run `job` through the door in a task of `tg`; its answer lands in the list (a keyed
    job's answer is always rendered: it may be kept or replayed)."""
    got: list[Rendered] = []

    async def run() -> None:
        answer = await door.run(job, client)
        assert isinstance(answer, Rendered)
        got.append(answer)

    tg.start_soon(run)
    return got


def replayed(answer: Outcome) -> Rendered:
    """`answer` as a request that joined its leader, or came after it, gets it."""
    assert isinstance(answer, Rendered)
    return Rendered(answer.status, answer.body, (*answer.headers, REPLAYED))


def code(outcome: Outcome) -> tuple[int, str]:
    assert isinstance(outcome, Rendered)
    return outcome.status, orjson.loads(outcome.body)["error"]["code"]


# -- joiners get their leader's answer, whatever it is -----------------------------------------
async def test_joiners_of_an_answered_leader_get_its_answer_and_the_model_runs_once() -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            joiners = [start(tg, door, keyed()) for _ in range(3)]
            await anyio.wait_all_tasks_blocked()
            assert len(core.queued) == 1
            core.answer()
    (answer,) = leader
    assert answer.status == 200 and orjson.loads(answer.body)["output"] == "olleh"
    assert [joiner[0] for joiner in joiners] == [replayed(answer)] * 3


async def test_joiners_of_a_leader_refused_while_queued_get_its_refusal_not_a_retry() -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            joiners = [start(tg, door, keyed()) for _ in range(2)]
            await anyio.wait_all_tasks_blocked()
            core.fail(ShuttingDown("the server shut down before the item ran"))
    assert code(leader[0]) == (503, "shutting_down")
    assert [joiner[0] for joiner in joiners] == [replayed(leader[0])] * 2


async def test_joiners_of_a_leader_that_timed_out_get_its_504_not_a_retry() -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start(tg, door, keyed(timeout=0.05))  # never answered: its deadline passes
            await anyio.wait_all_tasks_blocked()
            joiners = [start(tg, door, keyed(timeout=10.0)) for _ in range(2)]
    assert code(leader[0]) == (504, "deadline_exceeded")
    assert [joiner[0] for joiner in joiners] == [replayed(leader[0])] * 2
    assert core.queued == [] and len(core.cancelled) == 1  # withdrawn, never run


async def test_joiners_of_a_leader_whose_client_left_are_told_to_retry() -> None:
    core, client = QueueCore(), Client()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start(tg, door, keyed(), client)
            await anyio.wait_all_tasks_blocked()
            joiners = [start(tg, door, keyed()) for _ in range(2)]
            await anyio.wait_all_tasks_blocked()
            client.hang_up()
    assert code(leader[0]) == (499, "client_closed") and len(core.cancelled) == 1
    for (joiner,) in joiners:
        assert code(joiner) == (503, "retry") and ("Retry-After", "1") in joiner.headers
        assert REPLAYED not in joiner.headers


async def test_the_request_after_a_leader_whose_client_left_leads_again() -> None:
    core, client = QueueCore(), Client()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            start(tg, door, keyed(), client)
            await anyio.wait_all_tasks_blocked()
            client.hang_up()
        async with anyio.create_task_group() as tg:
            again = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.answer()
    assert again[0].status == 200 and REPLAYED not in again[0].headers


async def test_a_joiner_whose_own_deadline_passes_first_gets_504_and_the_leader_runs_on() -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start(tg, door, keyed(timeout=10.0))
            await anyio.wait_all_tasks_blocked()
            joiner = await door.run(keyed(timeout=0.05))  # waits on its leader till then
            core.answer()
    assert code(joiner) == (504, "deadline_exceeded")
    assert leader[0].status == 200 and replayed(leader[0]) == await door.run(keyed())


# -- what is kept for the requests that come after ---------------------------------------------
async def test_a_leaders_answer_is_replayed_to_later_requests_without_running_again() -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            first = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.answer()
        later = [await door.run(keyed()) for _ in range(2)]
    assert later == [replayed(first[0])] * 2 and core.queued == []
    assert door.metrics.registry.get_sample_value("batchgate_idempotent_replays_total") == 2


async def test_a_leader_refused_at_admission_is_not_kept_and_the_next_request_runs() -> None:
    core = QueueCore()
    door = door_over(core)
    core.refusing = OverBudget("expected wait 900 ms exceeds the paid tier's budget", 0.5)
    assert code(await door.run(keyed())) == (503, "over_budget")
    core.refusing = None
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            again = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.answer()
    assert again[0].status == 200 and REPLAYED not in again[0].headers


async def test_the_key_with_another_body_is_refused_while_in_flight_and_after() -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            start(tg, door, keyed("hello"))
            await anyio.wait_all_tasks_blocked()
            assert code(await door.run(keyed("other"))) == (422, "idempotency_key_reused")
            core.answer()
    assert code(await door.run(keyed("other"))) == (422, "idempotency_key_reused")


async def test_the_same_key_in_another_account_is_another_request() -> None:
    core = QueueCore()
    door = door_over(core)
    other = Principal(Tier.PAID, "globex", "key-2")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            mine, theirs = start(tg, door, keyed()), start(tg, door, keyed(who=other))
            await anyio.wait_all_tasks_blocked()
            assert len(core.queued) == 2
            core.answer()
    assert REPLAYED not in mine[0].headers and REPLAYED not in theirs[0].headers


async def test_a_replay_counts_against_the_callers_rate() -> None:
    core = QueueCore()
    door = door_over(core, {t: replace(ROOMY[t], burst=1, rate=0.001) for t in Tier})
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.answer()
    assert code(await door.run(keyed())) == (429, "rate_limited")


# -- the keyed path alone, over a `serve` the test settles -------------------------------------
class Serving:
    """The keyed path's `serve`: answers each text reversed, or raises `error`; while held,
    every run waits for `release()`."""

    def __init__(self, error: BatchgateError | None = None) -> None:
        self.error, self.runs = error, 0
        self._held: anyio.Event | None = None

    def hold(self) -> None:
        self._held = anyio.Event()

    def release(self) -> None:
        assert self._held is not None
        self._held.set()

    async def __call__(self, job: Job, client: ClientWatch | None,
                       register: object, pending: object = None) -> Answered:
        self.runs += 1
        if self._held is not None:
            await self._held.wait()
        await anyio.lowlevel.checkpoint()
        if self.error is not None:
            raise self.error
        return Answered([text[::-1] for text in job.texts], (0.0,), 0.0)


def keyed_path(serve: Serving) -> KeyedPath:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    return KeyedPath(store, MonotonicClock(), Metrics(), serve,
                     lambda exc, tier: rendered(to_api_error(exc)))


async def lead(path: KeyedPath, job: Job) -> Rendered:
    return await path.run(job, None, None)


def start_keyed(tg: TaskGroup, path: KeyedPath, job: Job) -> list[Rendered]:
    got: list[Rendered] = []

    async def run() -> None:
        got.append(await path.run(job, None, None))

    tg.start_soon(run)
    return got


@pytest.mark.parametrize(("error", "status"), [
    (OverBudget("expected wait 900 ms exceeds the paid tier's budget", 0.5), 503),
    (WorkerCrashed("the item's worker died 12 times"), 503),
    (DeadlineExceeded("the deadline passed before it was answered"), 504),
])
async def test_joiners_get_their_leaders_refusal_or_timeout_as_it_was(
    error: BatchgateError, status: int
) -> None:
    serve = Serving(error)
    serve.hold()
    path = keyed_path(serve)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start_keyed(tg, path, keyed())
            await anyio.wait_all_tasks_blocked()
            joiners = [start_keyed(tg, path, keyed()) for _ in range(2)]
            await anyio.wait_all_tasks_blocked()
            serve.release()
    assert leader[0].status == status and serve.runs == 1
    assert [joiner[0] for joiner in joiners] == [replayed(leader[0])] * 2


@pytest.mark.parametrize(("error", "status"), [
    (None, 200),
    (ApiError("invalid_request", "inputs must be strings"), 400),
    (ApiError("input_too_large", "a string is over --max-input-chars"), 413),
    (ApiError("empty_inputs", "inputs is empty"), 422),
])
async def test_what_running_the_request_decided_is_replayed_to_the_next_request(
    error: BatchgateError | None, status: int
) -> None:
    serve = Serving(error)
    path = keyed_path(serve)
    first = await lead(path, keyed())
    again = await lead(path, keyed())
    assert first.status == status and again == replayed(first) and serve.runs == 1


@pytest.mark.parametrize(("error", "status"), [
    (RateLimited("rate limit exceeded for this key or account", 1), 429),
    (OverBudget("expected wait 900 ms exceeds the paid tier's budget", 0.5), 503),
    (WorkerCrashed("the item's worker died 12 times"), 503),
    (DeadlineExceeded("the deadline passed before it was answered"), 504),
    (ModelError("ValueError", "bad input"), 500),
])
async def test_a_refusal_timeout_or_failure_is_not_kept_and_the_next_request_runs(
    error: BatchgateError, status: int
) -> None:
    serve = Serving(error)
    path = keyed_path(serve)
    first = await lead(path, keyed())
    serve.error = None
    again = await lead(path, keyed())
    assert first.status == status and again.status == 200 and serve.runs == 2
    assert REPLAYED not in again.headers


@pytest.mark.parametrize(("status", "kept"), [
    (200, True), (201, True), (400, True), (413, True), (422, True),
    (401, False), (429, False), (499, False), (500, False), (503, False), (504, False),
])
def test_only_what_running_the_request_decided_is_kept(status: int, kept: bool) -> None:
    assert is_kept(status) is kept


# -- what ran is said with the answer -----------------------------------------------------------
async def test_a_leaders_own_run_carries_its_version_and_waits_and_a_replay_carries_none(
) -> None:
    core = QueueCore()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            leader = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.answer()
        later = await door.run(keyed())
    (answer,) = leader
    assert answer.model == ONE_VERSION == orjson.loads(answer.body)["model"]
    assert len(answer.waits) == 1 and answer.batch >= 0
    assert isinstance(later, Rendered) and (later.waits, later.model) == ((), "")


class _Stages:
    """An input's way through guard stages, as the door asks it (`batcher.Staged`)."""

    def __init__(self, flying: bool) -> None:
        self.flying = flying

    def in_flight(self) -> bool:
        return self.flying

    def item_done(self, item: Item, result: str | BaseException) -> None:
        raise AssertionError("the door never settles a stage's item")


@pytest.mark.parametrize("flying", [True, False])
async def test_a_guarded_input_runs_on_past_its_deadline_only_while_a_stage_of_it_runs(
        flying: bool) -> None:
    """What ran is kept: an input between guard stages is in no batch of its own, but one
    whose stage item is in a batch runs on, and its answer is kept when it lands."""
    landed: list[KeptRequest] = []
    request = KeptRequest(1, landed.append)
    item = Item(ItemId(1), "x", Tier.PAID, 0.0, 1.0, request, route=_Stages(flying))
    request.expire()
    assert request.runs_on([item]) is flying
    if flying:
        request.item_done(item, "X")
        assert landed == [request] and request.outputs == ["X"]
