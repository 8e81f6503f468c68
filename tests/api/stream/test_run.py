"""`StreamRun`: a streamed request's parts, its window, the order and numbers of its events,
resuming, leaving and its deadline, against a fake core whose parts the test answers one by
one (each step is a condition the test sets, never a wait)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest

from api.config import Principal
from api.errors import error_body
from api.http import Answered, ClientWatch, Framing, Job, Outcome, Rendered
from api.stream import PART_INPUTS, StreamRun
from batcher import Tier

WHO = Principal(Tier.PAID, "acme", "k")


class PartCore:
    """A `CoreView` whose parts wait until the test answers them."""

    def __init__(self) -> None:
        self.parts: list[tuple[Job, asyncio.Future[Outcome]]] = []

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.parts.append((job, answer))
        client.watch(lambda: answer.done() or answer.set_result(
            Rendered(499, error_body("client_closed", "the client left"))))
        return await answer

    async def status(self, call: Any, *args: Any) -> Any:
        raise AssertionError("a run asks nothing of the core")

    def answer(self, at: int, position: int | None = None) -> None:
        """Part `at` answered with each input's text upper-cased (numbered `position`)."""
        job, answer = self.parts[at]
        outputs: list[str | None] = [t.upper() for t in job.texts]
        if position is None:
            answer.set_result(Answered(outputs, (0.0,), 0.1, model="m@v1"))
        else:
            answer.set_result(Rendered(200, orjson.dumps({"id": "x", "outputs": outputs,
                                                          "model": "m@v1"}),
                                       (("Stream-Position", str(position)),)))


def texts(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


def stream(core: PartCore, n: int, window: int = 10_000, after: int = 0, keyed: bool = False,
           clock: Callable[[], float] | None = None, timeout: float = 60.0) -> StreamRun:
    key = ("k", b"digest") if keyed else None
    job = Job(WHO, texts(n), False, timeout, key, "m@v1", stream="k" if keyed else "s")
    return StreamRun(core, job, Framing.NDJSON, window, after, clock or (lambda: 0.0))


async def settle() -> None:
    """Let every task that can run, run (no time passes)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def next_chunk(events: AsyncIterator[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (await anext(events)).splitlines()]


async def read_all(run_: StreamRun, got: list[dict[str, Any]]) -> None:
    """Read `run_` to its end, its events into `got`."""
    async for chunk in run_.events():
        got.extend(orjson.loads(line) for line in chunk.splitlines())


def run(test: Callable[[], Any]) -> None:
    asyncio.run(test())


def test_parts_go_out_a_window_at_a_time_and_no_more_while_the_client_reads_nothing() -> None:
    async def main() -> None:
        core = PartCore()
        run_ = stream(core, 200, window=2 * PART_INPUTS)
        events = run_.events()
        pending = asyncio.ensure_future(anext(events))
        await settle()
        assert [len(job.texts) for job, _ in core.parts] == [PART_INPUTS, PART_INPUTS]
        core.answer(1)  # answered out of order: its events go first
        chunk = [orjson.loads(line) for line in (await pending).splitlines()]
        assert [e["index"] for e in chunk] == list(range(25, 50))
        assert chunk[0] == {"index": 25, "output": "T25"}
        await settle()
        assert len(core.parts) == 2  # the client holds the chunk: nothing more goes out
        pending = asyncio.ensure_future(anext(events))
        await settle()
        assert len(core.parts) == 3  # it read: the window has room for one more part
        assert all(job.stream == "s" and job.model == "m@v1" for job, _ in core.parts)
        pending.cancel()

    run(main)


def test_every_input_is_answered_once_and_done_counts_them() -> None:
    async def main() -> None:
        core = PartCore()
        run_ = stream(core, 60)
        got: list[dict[str, Any]] = []
        reader = asyncio.ensure_future(read_all(run_, got))
        await settle()
        core.answer(2)
        answer = core.parts[0][1]
        answer.set_result(Rendered(503, error_body("over_budget", "busy"),
                                   (("Retry-After", "1"),)))
        await settle()
        core.answer(1)
        await reader
        assert [e.get("index") for e in got] == [*range(50, 60), *range(25), *range(25, 50),
                                                 None]
        assert got[10]["error"] == {"code": "over_budget", "message": "busy"}
        assert got[-1]["done"] is True and got[-1]["model"] == "m@v1"
        assert got[-1]["counts"] == {"outputs": 35, "errors": 25}

    run(main)


def test_a_keyed_stream_sends_its_parts_in_the_order_the_door_numbered_them() -> None:
    async def main() -> None:
        core = PartCore()
        run_ = stream(core, 50, keyed=True)
        events = run_.events()
        pending = asyncio.ensure_future(anext(events))
        await settle()
        assert [job.idempotency[0] for job, _ in core.parts if job.idempotency] == \
            ["k #0", "k #1"]
        assert core.parts[0][0].idempotency != core.parts[1][0].idempotency
        assert all(job.stream == "k" for job, _ in core.parts)
        core.answer(0, position=25)  # numbered second: held until the first comes
        await settle()
        assert not pending.done()
        core.answer(1, position=0)
        first = [orjson.loads(line) for line in (await pending).splitlines()]
        assert [e["index"] for e in first] == [*range(25, 50), *range(25)]
        last = await next_chunk(events)
        assert last[0]["done"] is True

    run(main)


def test_a_resumed_stream_leaves_out_the_events_its_client_has() -> None:
    async def main() -> None:
        core = PartCore()
        run_ = StreamRun(core, Job(WHO, texts(50), False, 60.0, ("k", b"d"), "m@v1",
                                   stream="k"),
                         Framing.SSE, 10_000, after=30, clock=lambda: 0.0)
        events = run_.events()
        pending = asyncio.ensure_future(anext(events))
        await settle()
        core.answer(1, position=0)
        core.answer(0, position=25)
        sent = await pending
        ids = [int(line[4:]) for line in sent.decode().splitlines() if line.startswith("id: ")]
        assert ids == list(range(30, 50))  # events 0..29 it has
        assert b'"index":5,' in sent  # part 0's inputs, numbered 25.. : from 30 on
        done = (await anext(events)).decode()
        assert done.startswith("id: 50\n") and '"done":true' in done

    run(main)


def test_a_client_that_leaves_withdraws_every_part_not_answered() -> None:
    async def main() -> None:
        core = PartCore()
        run_ = stream(core, 500, window=100)
        events = run_.events()
        pending = asyncio.ensure_future(anext(events))
        await settle()
        assert len(core.parts) == 4
        run_.leave()
        with pytest.raises(StopAsyncIteration):
            await pending
        await settle()
        assert all(answer.done() and answer.result().status == 499
                   for _, answer in core.parts)  # each part heard its client leave
        assert len(core.parts) == 4  # and nothing more went out

    run(main)


def test_parts_not_sent_by_the_deadline_are_answered_deadline_exceeded_unrun() -> None:
    async def main() -> None:
        now = [0.0]
        core = PartCore()
        run_ = stream(core, 100, window=50, clock=lambda: now[0], timeout=1.0)
        got: list[dict[str, Any]] = []
        reader = asyncio.ensure_future(read_all(run_, got))
        await settle()
        assert [job.timeout for job, _ in core.parts] == [1.0, 1.0]
        now[0] = 2.0  # past the deadline before the window had room for the rest
        core.answer(0)
        core.answer(1)
        await reader
        assert len(core.parts) == 2  # the rest never went to the core
        late = [e for e in got if "error" in e]
        assert [e["index"] for e in late] == list(range(50, 100))
        assert {e["error"]["code"] for e in late} == {"deadline_exceeded"}
        assert got[-1]["counts"] == {"outputs": 50, "errors": 50}

    run(main)


def test_a_part_whose_task_had_not_begun_when_its_client_left_never_reaches_the_core() -> None:
    async def main() -> None:
        core = PartCore()
        run_ = stream(core, 500, window=100)
        pending = asyncio.ensure_future(anext(run_.events()))
        await asyncio.sleep(0)  # the stream sends its first parts: their tasks are made
        run_.leave()
        await settle()
        assert core.parts == []
        with pytest.raises(StopAsyncIteration):
            await pending

    run(main)
