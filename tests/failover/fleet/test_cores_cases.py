"""`ModelCores`, worked cases in virtual time: cold starts (queued, refused, right after the
start, a refusal as the request for a load), retirement, rollouts (with several workers, with
one, within a residency), tier order between models, races between a death and a switch or a
restart, and a catalogue shrunk to one version. The world checks every action
(`driver.World`); each case states what the client sees."""

from __future__ import annotations

from typing import Any

import pytest

from batcher import Tier
from failover.errors import ModelLoading, UnknownModel
from failover.fleet.catalogue import Catalogue
from failover.fleet.versions import ROLLOUT_TIMEOUT_S
from tests.failover.fleet.driver import PLACEMENT, World, output


def version(load_s: float) -> dict[str, Any]:
    return {"spec": "sim", "load_s": load_s}


def catalogue(**models: dict[str, Any]) -> Catalogue:
    return Catalogue.from_dict({"models": models})


A = {"default": "v1", "min_workers": 1, "versions": {"v1": version(0.3), "v2": version(0.6)}}
B = {"min_workers": 0, "idle_unload_s": 2, "versions": {"v1": version(0.5)}}


def cold_b(idle_unload_s: float = 2.0) -> World:
    """Two workers, both on a@v1: b went cold (idle past its idle_unload_s)."""
    w = World(catalogue(a=A, b={**B, "idle_unload_s": idle_unload_s}), 2)
    assert [s.version for s in w.slots] == ["a@v1", "b@v1"]
    w.run(6.0)
    assert [s.version for s in w.slots] == ["a@v1", "a@v1"] and w.resident("b@v1") == 0
    return w


def served(w: World, model: str, version: str, n: int = 1) -> None:
    """A request for `model` is answered by `version`."""
    items = w.submit(model, n)
    assert isinstance(items, list), items
    w.run(w.now + 3.0)
    assert w.answers(items) == [output(version, i.text) for i in items]


# -- cold start --------------------------------------------------------------------------------

def test_a_request_for_a_cold_version_is_queued_and_answered_once_a_switch_loads_it() -> None:
    w = cold_b()
    items = w.submit("b", 2, timeout=5.0)
    assert isinstance(items, list)
    at, _, old, to = w.switches[-1]
    assert (at, old, to) == (w.now, "a@v1", "b@v1")
    w.run(w.now + 2.0)
    assert w.answers(items) == [output("b@v1", i.text) for i in items]


def test_a_frame_with_a_cold_refusal_asks_the_owner_for_a_turn() -> None:
    w = cold_b()
    refusals, turn = w.admit_all([(w.new_items("b@v1", Tier.PAID, 1, 0.2), 0.2)])
    assert isinstance(refusals[0], ModelLoading) and turn


def test_a_cold_request_its_deadline_cannot_wait_for_is_refused_with_the_load_eta() -> None:
    w = cold_b()
    refused = w.submit("b", timeout=0.2)
    assert isinstance(refused, ModelLoading)
    assert 0.5 <= refused.retry_after < 1.0  # the hint, and a batch at most before it
    assert w.switches[-1][2:] == ("a@v1", "b@v1"), "the refused request started the load"
    w.run(w.now + refused.retry_after)
    served(w, "b", "b@v1")


def test_right_after_the_start_a_cold_request_waits_only_if_its_load_can_begin_in_time() -> None:
    """Every worker is within its residency: the ETA counts it, so a request is refused
    (its Retry-After then holds) rather than queued to time out."""
    w = World(catalogue(a={**A, "versions": {"v1": version(0.3), "v2": version(1.5)}}), 2)
    stay = PLACEMENT.min_resident(0.3)
    refused = w.submit("a@v2", timeout=2.0)
    assert isinstance(refused, ModelLoading)
    assert refused.retry_after == pytest.approx(stay + 1.5)
    w.run(stay - 0.4)
    items = w.submit("a@v2", timeout=2.0)  # its load can begin in time now
    assert isinstance(items, list), items
    w.run(w.now + 2.0)
    assert w.answers(items) == [output("a@v2", items[0].text)]


def test_a_refused_request_is_the_request_for_a_load_when_a_worker_may_leave() -> None:
    """Refused while every worker is within its residency, with no other request: the
    version is loaded once one may leave, so its Retry-After holds."""
    w = World(catalogue(a={**A, "versions": {"v1": version(0.3), "v2": version(1.5)}}), 2)
    refused = w.submit("a@v2", timeout=2.0)
    assert isinstance(refused, ModelLoading)
    w.run(refused.retry_after)
    assert w.resident("a@v2") == 1
    served(w, "a@v2", "a@v2")


# -- retirement --------------------------------------------------------------------------------

def test_a_retired_version_finishes_its_queue_takes_nothing_new_and_leaves() -> None:
    w = World(catalogue(a=A), 2)
    served(w, "a@v2", "a@v2")
    w.run(w.now + 1.0)
    queued = w.submit("a@v2", 12)
    assert isinstance(queued, list)
    w.serve(w.cores.catalogue.retire("a", "v2"))
    with pytest.raises(UnknownModel):
        w.cores.resolve("a@v2", None)
    stale = w.new_items("a@v2", Tier.PAID, 1, 5.0)
    with pytest.raises(UnknownModel):
        w.admit(stale, 5.0)
    w.run(w.now + 3.0)
    assert w.answers(queued) == [output("a@v2", i.text) for i in queued]
    assert w.resident("a@v2") == 0 and w.resident("a@v1") == 2
    assert "a@v2" not in {s.version for s in w.cores.versions(w.now)}


def test_once_one_version_is_left_a_stale_request_for_a_retired_one_is_refused() -> None:
    w = World(catalogue(a=A), 1)
    w.serve(w.cores.catalogue.retire("a", "v2"))  # its empty core is dropped: one is left
    assert [s.version for s in w.cores.versions(w.now)] == ["a@v1"]
    with pytest.raises(UnknownModel):
        w.admit(w.new_items("a@v2", Tier.PAID, 1, 5.0), 5.0)


def test_a_catalogue_shrunk_to_one_version_leaves_no_deadline_in_the_past() -> None:
    w = World(catalogue(a=A), 1)
    w.serve(w.cores.catalogue.retire("a", "v2"))
    w.run(30.0)  # the loop fails if the owner would spin
    assert w.cores.next_deadline() > w.now


def test_a_version_retired_and_served_again_takes_requests() -> None:
    w = World(catalogue(a=A), 2)
    served(w, "a@v2", "a@v2")
    (slot,) = [s for s in w.slots if s.version == "a@v2"]
    w.serve(w.cores.catalogue.retire("a", "v2"))
    w.die(slot.worker)  # its worker dies before it leaves; the slot restarts a@v2
    w.report_deaths()
    w.run(w.now + 1.0)
    w.serve(catalogue(a=A))  # SIGHUP: the file as it was
    w.run(w.now + 1.0)
    served(w, "a@v2", "a@v2")


# -- rollout -----------------------------------------------------------------------------------

def test_a_new_default_takes_over_once_resident_on_as_many_workers_as_the_old() -> None:
    w = World(catalogue(a=A), 3)
    w.run(2.0)
    w.serve(w.cores.catalogue.with_settings("a", default="v2"))
    seen = []
    while w.now < 20.0 and w.cores.serving_default("a") == "v1":
        items = w.submit("a")
        assert isinstance(items, list), items
        seen.append(items[0].version)
        w.run(w.now + 0.2)
    assert set(seen) == {"a@v1"} and w.cores.serving_default("a") == "v2"
    # The rollout moves the old default's workers one at a time: they are level at once.
    assert w.spy.flips == [("a", "a@v1", "a@v2", 1, 1)]
    served(w, "a", "a@v2")


def test_a_rollout_takes_no_worker_of_the_old_default_within_its_residency() -> None:
    w = World(catalogue(a=A), 2)
    w.run(0.5)
    w.serve(w.cores.catalogue.with_settings("a", default="v2"))
    w.run(3.0)
    first = min(t for t, *_, to in w.switches if to == "a@v2")
    assert first == pytest.approx(PLACEMENT.min_resident(0.3))  # loaded at 0


def test_a_rollout_off_a_models_only_worker_moves_it_after_the_timeout() -> None:
    w = World(catalogue(a=A), 1)
    w.serve(w.cores.catalogue.with_settings("a", default="v2"))
    w.run(ROLLOUT_TIMEOUT_S - 1.0)
    served(w, "a", "a@v1")
    w.run(ROLLOUT_TIMEOUT_S + 1.0)
    assert w.cores.serving_default("a") == "v2"
    items = w.submit("a", timeout=5.0)
    assert isinstance(items, list), items
    w.run(w.now + 3.0)
    assert w.answers(items) == [output("a@v2", items[0].text)]


# -- placement through the cores ---------------------------------------------------------------

def test_paid_work_gets_the_free_worker_before_free_work_of_another_model() -> None:
    models = {"a": {**A, "versions": {"v1": version(0.3)}}, "p": B, "f": B}
    w = World(catalogue(**models), 2)
    w.run(6.0)
    assert w.resident("p@v1") == w.resident("f@v1") == 0
    free = w.new_items("f@v1", Tier.FREE, 1, 5.0)
    paid = w.new_items("p@v1", Tier.PAID, 1, 5.0)
    refusals, _ = w.admit_all([(free, 5.0), (paid, 5.0)])
    assert refusals == [None, None]
    assert [to for at, _, _, to in w.switches if at == w.now] == ["p@v1"]


def test_a_workers_death_before_its_switch_is_carried_out_loses_nothing() -> None:
    w = cold_b()
    first = min(w.slots, key=lambda s: s.since)  # placement takes the longest resident
    w.die(first.worker)  # dead in the pool, not yet reported: the cores switch it
    items = w.submit("b", timeout=5.0)
    assert isinstance(items, list)
    assert w.switches[-1][1] == first.worker
    w.report_deaths()  # the switch did nothing; the slot restarts a@v1
    w.run(w.now + 4.0)
    assert w.answers(items) == [output("b@v1", items[0].text)]


def test_a_crashed_worker_restarting_is_not_replaced_by_a_switch() -> None:
    w = World(catalogue(a=A, b={**B, "idle_unload_s": 100}), 2)
    w.run(2.0)
    (slot,) = [s for s in w.slots if s.version == "a@v1"]
    w.die(slot.worker)
    w.report_deaths()
    w.run(w.now + 0.2)
    assert w.switches == [] and w.resident("b@v1") == 1
    w.run(w.now + 1.0)
    served(w, "a", "a@v1")


def test_a_version_stays_for_the_minimum_residency_after_its_load() -> None:
    w = cold_b(idle_unload_s=0.2)  # b would be unloaded well before its residency ends
    assert isinstance(w.submit("b"), list)
    while not w.resident("b@v1"):
        w.run(w.now + 0.05)
    (loaded,) = [s.since for s in w.slots if s.version == "b@v1"]
    w.run(loaded + 30.0)
    away = [t for t, _, old, _ in w.switches if old == "b@v1" and t > loaded]
    assert away and min(away) >= loaded + PLACEMENT.min_resident(0.5)


def test_free_items_run_again_on_the_one_worker_a_switch_left_their_version() -> None:
    w = World(catalogue(a=A, b={**B, "idle_unload_s": 100}), 3)
    w.run(2.0)
    assert isinstance(w.submit("a@v2"), list)  # takes one of a@v1's two workers
    w.run(w.now + 1.0)
    assert w.resident("a@v1") == 1
    items = w.submit("a@v1", 2, Tier.FREE, timeout=5.0)
    assert isinstance(items, list)
    w.advance(w.now + 0.1)
    (worker,) = [f for f, flight in w.flights.items() if flight.version == "a@v1"]
    w.die(worker)  # its batch runs again once the slot is back (a group of the table)
    w.report_deaths()
    w.run(w.now + 2.0)
    assert w.answers(items) == [output("a@v1", i.text) for i in items]
