"""The lifespan's supervision of the service: a core that fails once serving ends the process."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskStatus

from api.door import EXIT_CORE_FAILED, supervised

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Broken(RuntimeError):
    pass


async def fails_after_start(*, task_status: TaskStatus[None]) -> None:
    task_status.started()
    await anyio.lowlevel.checkpoint()
    raise Broken("the pool's task group died (Too many open files)")


async def fails_before_start(*, task_status: TaskStatus[None]) -> None:
    raise Broken("no worker became ready")


async def test_a_core_that_fails_once_serving_ends_the_process_with_a_status() -> None:
    exits: list[int] = []
    async with anyio.create_task_group() as tg:
        await tg.start(supervised, fails_after_start, exits.append)
    assert exits == [EXIT_CORE_FAILED]


async def test_a_failure_while_starting_is_raised_to_the_caller() -> None:
    exits: list[int] = []
    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, fails_before_start, exits.append)
    assert caught.group_contains(Broken) and exits == []
