import asyncio
import math

import anyio
import pytest

from api.errors import ApiError
from api.http import Collation, Deadlines, Limits, TurnEnds, parse_body, parse_timeout

LIMITS = Limits(max_inputs=100, max_input_chars=10, max_body_bytes=1000)


def status_of(body: bytes) -> int:
    with pytest.raises(ApiError) as info:
        parse_body(body, LIMITS)
    return info.value.status


def test_single_input() -> None:
    parsed = parse_body(b'{"input": "abc"}', LIMITS)
    assert parsed.texts == ["abc"] and parsed.single


def test_many_inputs_keep_their_order() -> None:
    parsed = parse_body(b'{"inputs": ["a", "b", "c"]}', LIMITS)
    assert parsed.texts == ["a", "b", "c"] and not parsed.single


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b'{"input": 3}', 400),
        (b'{"inputs": "abc"}', 400),
        (b'{"inputs": ["a", 1]}', 400),
        (b'{"input": "a", "inputs": ["b"]}', 400),
        (b"{}", 400),
        (b'{"inputs": []}', 422),
        (b'{"inputs": ' + str(["x"] * 101).replace("'", '"').encode() + b"}", 422),
        (b'{"input": "01234567890"}', 413),
        (b'{"input": "a", "model": "not a name"}', 422),
        (b'{"input": "a", "model": "m@v@w"}', 422),
        (b'{"input": "a", "model": 7}', 400),
    ],
)
def test_bad_bodies_are_refused_with_the_right_status(body: bytes, status: int) -> None:
    assert status_of(body) == status


def test_the_served_model_may_be_named() -> None:
    assert parse_body(b'{"input": "a", "model": "sim"}', LIMITS).texts == ["a"]


def test_timeout_header_is_defaulted_capped_and_checked() -> None:
    assert parse_timeout(None, 10.0, 60.0) == 10.0
    assert parse_timeout("250", 10.0, 60.0) == 0.25
    assert parse_timeout("999999", 10.0, 60.0) == 60.0
    assert parse_timeout("1", 10.0, 60.0) == 0.001
    for bad in ("soon", "-5", "0", "nan", "5e-324", "0.999"):  # 5e-324: found by fuzzing
        with pytest.raises(ApiError):
            parse_timeout(bad, 10.0, 60.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # deadlines are timers of the asyncio loop


class Ending(Collation):
    def __init__(self) -> None:
        super().__init__(1)
        self.ends = asyncio.Event()

    def ended(self) -> None:
        assert not self.ends.is_set(), "a collation ends once"
        self.ends.set()


@pytest.mark.anyio
async def test_deadlines_in_one_slot_share_a_timer_that_goes_with_the_last_of_them() -> None:
    deadlines = Deadlines(slot_s=1000.0)
    now = (math.floor(asyncio.get_running_loop().time() / 1000) + 1) * 1000 + 1
    first, second = Ending(), Ending()
    deadlines.add(first, 1.0, now)
    deadlines.add(second, 2.0, now)
    (timer,) = [due.timer for due in deadlines._slots.values()]
    deadlines.discard(first)
    assert len(deadlines) == 1 and not timer.cancelled()
    deadlines.discard(second)
    deadlines.discard(second)  # twice: nothing more
    assert len(deadlines) == 0 and timer.cancelled()


@pytest.mark.anyio
async def test_a_deadline_expires_its_collation_once_and_leaves_no_slot() -> None:
    deadlines = Deadlines(slot_s=0.01)
    late, answered = Ending(), Ending()
    now = asyncio.get_running_loop().time()
    deadlines.add(late, 0.0, now)
    deadlines.add(answered, 0.0, now)
    deadlines.discard(answered)
    with anyio.fail_after(5):
        await late.ends.wait()
    assert late.timed_out and len(deadlines) == 0
    assert not answered.ends.is_set()


@pytest.mark.anyio
async def test_clearing_deadlines_cancels_every_timer() -> None:
    deadlines = Deadlines(slot_s=0.01)
    now = asyncio.get_running_loop().time()
    for seconds in (1.0, 2.0, 3.0):
        deadlines.add(Ending(), seconds, now)
    timers = [due.timer for due in deadlines._slots.values()]
    deadlines.clear()
    assert len(deadlines) == 0 and all(timer.cancelled() for timer in timers)


@pytest.mark.anyio
async def test_turn_ends_flushed_at_a_turns_end_are_concluded_then_and_once() -> None:
    concluded: list[list[str]] = []
    ends = TurnEnds[str](concluded.append)
    ends.add("a")
    ends.add("b")
    assert concluded == []  # a loop pass later, unless flushed
    ends.flush()
    assert concluded == [["a", "b"]]
    ends.flush()  # nothing more ended: nothing concluded
    ends.add("c")  # ended outside a turn (a timer, a hang-up): the loop's pass concludes it
    await anyio.wait_all_tasks_blocked()
    assert concluded == [["a", "b"], ["c"]]
