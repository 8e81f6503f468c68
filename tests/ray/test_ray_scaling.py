"""`--pool ray --workers 2:4` on a cluster with room for two actors, under load that wants
four: the other two stay pending until a node joins, then the pool grows to four; a node lost
under load loses nothing.

The load asks for four workers at a rate this machine offers beside a Ray cluster: batches of
at most 10 items (a worker drains 100 items/s) and 300 RPS, more than two workers drain at the
rule's target utilisation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from loadtest.scale_step import MODEL, mix, model_args, write_keys
from loadtest.server import running_server
from loadtest.watch import Observed, offer_watching
from tests.ray.lab import Lab, Worker, in_state, up, wait_workers

pytestmark = pytest.mark.e2e
MAX_BATCH, RPS = 10, 300.0
LOAD_S = 35.0  # enough for the steps below (each bounded); the last test checks it was


@dataclass
class Story:
    """What the pool showed at each step, under one run of load."""

    seen: Observed | None = None
    pending: list[Worker] = field(default_factory=list)  # room for two: the other two wait
    still: list[Worker] = field(default_factory=list)  # a few seconds later
    grown: list[Worker] = field(default_factory=list)  # a node joined
    joined: str = ""
    lost_node: str = ""
    after_loss: list[Worker] = field(default_factory=list)
    began: float = 0.0  # the load's first send (monotonic)
    at: dict[str, float] = field(default_factory=dict)  # when each step was done


def two_up_two_pending(ws: list[Worker]) -> bool:
    return len(up(ws)) == 2 and len(in_state(ws, "pending")) == 2


def scale(url: str, lab: Lab, story: Story) -> None:
    """The cluster's steps, in this (the main) thread: Ray adds a node only from there."""

    def wait(condition: Callable[[list[Worker]], bool], within: float = 30) -> list[Worker]:
        return anyio.run(wait_workers, url, condition, within)

    story.pending = wait(two_up_two_pending, within=40)
    story.at["pending"] = time.monotonic()
    time.sleep(3)  # no room appears by itself: the pending pair still waits after this
    story.still = wait(lambda ws: True)
    story.joined = lab.add_node()
    story.grown = wait(lambda ws: len(up(ws)) == 4, within=60)
    story.at["grown"] = time.monotonic()
    story.lost_node = up(story.grown)[0]["node"]
    lab.remove_node(story.lost_node)
    story.at["lost"] = time.monotonic()
    story.after_loss = wait(lambda ws: len(up(ws)) == 2
                            and story.lost_node not in {w["node"] for w in up(ws)})
    story.at["after_loss"] = time.monotonic()


@pytest.fixture(scope="module")
def story(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    lab.remove_node(lab.worker_nodes()[0])  # one node of two slots: room for two actors
    keys = write_keys(Path(tmp_path_factory.mktemp("keys")))
    args = [*lab.serve_args(), "--workers", "2:4", "--scale-down-delay-s", "300",
            *model_args(MAX_BATCH, keys)]
    told = Story()
    with running_server(2, MODEL, args, ready_timeout_s=180) as srv:

        def load() -> None:  # its own thread and event loop, never held up by the steps
            told.seen, told.began = anyio.run(offer_watching, srv.url, mix(srv.url, RPS, LOAD_S),
                                     anyio.lowlevel.checkpoint)

        thread = threading.Thread(target=load, name="load")
        thread.start()
        try:
            scale(srv.url, lab, told)
        finally:
            thread.join(LOAD_S + 60)
    yield told


def test_the_two_actors_without_room_stay_pending(story: Story) -> None:
    assert two_up_two_pending(story.pending)
    assert two_up_two_pending(story.still)


def test_a_node_added_grows_the_pool_to_four(story: Story) -> None:
    assert len(up(story.grown)) == 4
    assert sum(w["node"] == story.joined for w in up(story.grown)) == 2


def test_a_node_lost_under_load_loses_nothing(story: Story) -> None:
    assert story.lost_node not in {w["node"] for w in up(story.after_loss)}
    seen = story.seen
    assert seen is not None
    # Under load: the load ran from before the pair was pending until after the loss was seen.
    ended = story.began + seen.probes[0].duration_s
    assert story.began < story.at["pending"] and story.at["after_loss"] < ended, \
        {k: round(t - story.began, 1) for k, t in story.at.items()}
    assert (seen.lost, seen.wrong) == (0, 0)
    assert seen.refused("paid") == 0, seen.rejected("paid")
    assert seen.total("paid", "ok") > 0
