"""What a dead core's workers ran for keyed requests (`gpu_pool.salvage`): an input is
answered from it only when its tag, its text and its version all match, a running batch is
waited for until it lands or its worker dies, and nothing is kept past `KEEP_S`."""

from __future__ import annotations

import anyio
import pytest

from batcher import Item, ItemId, Tier, VersionKey
from gpu_pool.protocol import Salvaged, WorkerId
from gpu_pool.salvage import KEEP_S, Salvage

pytestmark = pytest.mark.anyio

V1 = VersionKey("m@v1")
W = WorkerId(7)


class Sink:
    def __init__(self) -> None:
        self.got: dict[int, str | BaseException] = {}

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.got[item.index] = result


def items(sink: Sink, key: str, texts: list[str], version: str = V1) -> list[Item]:
    return [Item(ItemId(i), t, Tier.PAID, 0.0, 5.0, sink, i, version=VersionKey(version),
                 tag=("acme", key, i))
            for i, t in enumerate(texts)]


def batch(key: str, texts: list[str], outputs: list[str] | None, running: bool = False
          ) -> Salvaged:
    return Salvaged(tuple(("acme", key, i) for i in range(len(texts))), tuple(texts),
                    None if outputs is None else tuple(outputs), running)


def test_matching_inputs_are_answered_and_the_rest_run() -> None:
    salvage, sink = Salvage(), Sink()
    salvage.attached(W, V1, [batch("k", ["a", "b"], ["A", "B"])])
    # index 1's text differs from the batch's; index 2 was not in it: both run
    rest = salvage.settle(items(sink, "k", ["a", "x", "b"]), now=1.0)
    assert sink.got == {0: "A"}
    assert [(i.index, i.text) for i in rest] == [(1, "x"), (2, "b")]
    assert salvage.answered == 1


@pytest.mark.parametrize(("key", "version"), [("other", V1), ("k", "m@v2")])
def test_another_key_or_version_runs(key: str, version: str) -> None:
    salvage, sink = Salvage(), Sink()
    salvage.attached(W, V1, [batch("k", ["a"], ["A"])])
    assert len(salvage.settle(items(sink, key, ["a"], version), now=1.0)) == 1
    assert sink.got == {}


def test_a_failed_batch_is_not_kept() -> None:
    salvage, sink = Salvage(), Sink()
    salvage.attached(W, V1, [batch("k", ["a"], None)])
    assert len(salvage.settle(items(sink, "k", ["a"]), now=1.0)) == 1


def test_nothing_is_kept_past_its_time() -> None:
    now = [0.0]
    salvage, sink = Salvage(clock=lambda: now[0]), Sink()
    salvage.attached(W, V1, [batch("k", ["a"], ["A"])])
    now[0] = KEEP_S + 1
    assert len(salvage.settle(items(sink, "k", ["a"]), now=now[0])) == 1
    assert not salvage


async def test_a_running_batch_is_waited_for_until_it_lands() -> None:
    salvage, sink = Salvage(), Sink()
    salvage.attached(W, V1, [batch("k", ["a"], None, running=True)])
    assert salvage.runs("acme", "k") and not salvage.runs("acme", "other")
    async with anyio.create_task_group() as tg:
        tg.start_soon(salvage.settled, "acme", "k", 10.0)
        await anyio.wait_all_tasks_blocked()
        salvage.landed(W, batch("k", ["a"], ["A"]))
    assert not salvage.runs("acme", "k")
    assert salvage.settle(items(sink, "k", ["a"]), now=1.0) == [] and sink.got == {0: "A"}


async def test_a_running_batch_whose_worker_dies_runs_again() -> None:
    salvage, sink = Salvage(), Sink()
    salvage.attached(W, V1, [batch("k", ["a"], None, running=True)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(salvage.settled, "acme", "k", 10.0)
        await anyio.wait_all_tasks_blocked()
        salvage.lost(W)
    assert len(salvage.settle(items(sink, "k", ["a"]), now=1.0)) == 1
