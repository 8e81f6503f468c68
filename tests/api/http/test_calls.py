"""The status calls are named once: each has its handler in the core's one table, answered
the same way in a single process and across the link, and an unknown name is a LookupError."""

from __future__ import annotations

import pytest

from api.config import DEFAULT_TIERS, KeyRing, Settings
from api.door import LocalCore, build_door
from api.http import StatusCall
from api.metrics import Metrics
from tests.api.door.fakes import FakePool

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_call_is_found_by_its_name_on_the_link() -> None:
    assert [StatusCall.named(call.value) for call in StatusCall] == list(StatusCall)
    with pytest.raises(LookupError, match="no call named 'nope'"):
        StatusCall.named("nope")


def test_the_status_view_has_a_handler_for_every_call() -> None:
    parts = build_door(Settings(model="sim"), KeyRing({}, frozenset(), tiers=DEFAULT_TIERS),
                       Metrics(), pool=FakePool())
    assert set(parts.status.table) == set(StatusCall)


async def test_a_single_process_answers_each_call_from_the_table() -> None:
    parts = build_door(Settings(model="sim"), KeyRing({}, frozenset(), tiers=DEFAULT_TIERS),
                       Metrics(), pool=FakePool(), cell=lambda: {"gateways": [], "core": None})
    core = LocalCore(parts.door, parts.status.table)
    assert (await core.status(StatusCall.READY))["draining"] is False
    assert await core.status(StatusCall.CELL) == {"gateways": [], "core": None}
    assert isinstance(await core.status(StatusCall.METRICS_TEXT), bytes)
    status, body = await core.status(StatusCall.MODELS, "GET", None, None, b"")
    assert status == 200 and "models" in body
