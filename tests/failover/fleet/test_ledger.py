"""The ledger of starts: each start under its own identity from the moment it is asked for
until a worker is up for it or it is taken back; retried under the same identity with the
pool's backoff; measured when it ends."""

from __future__ import annotations

import math

import pytest

from batcher.shared import Backoff
from failover.fleet import LATE_SHARE, Kind, Ledger, Residency
from gpu_pool import Origin, StartId, StartKind, WorkerId

SPAWN, FORK, WAKE = StartKind.SPAWN, StartKind.FORK, StartKind.WAKE


def test_a_start_the_core_asks_for_has_a_new_identity_and_its_eta() -> None:
    ledger = Ledger()
    a = ledger.ask(Kind.ADD, "m@v1", 10.0, 5.0)
    b = ledger.ask(Kind.ADD, "m@v1", 10.0, 5.0)
    assert a != b and a.origin is b.origin is Origin.CORE
    assert [(s.id, s.eta) for s in ledger.adding()] == [(a, 15.0), (b, 15.0)]


def test_a_worker_up_ends_exactly_the_start_it_names() -> None:
    ledger = Ledger()
    first = ledger.ask(Kind.ADD, "m@v1", 0.0, 10.0)
    later = ledger.ask(Kind.ADD, "m@v1", 2.0, 3.0)
    done = ledger.up(later, 5.0)
    assert done is not None and done.id == later
    assert [s.id for s in ledger.adding()] == [first]
    assert ledger.up(later, 6.0) is None  # once only


def test_a_failed_start_is_retried_under_its_id_with_the_backoff_growing_to_the_cap() -> None:
    ledger = Ledger(Backoff())
    start = ledger.ask(Kind.ADD, "m@v1", 0.0, 5.0)
    waits = []
    for k in range(1, 9):
        retried = ledger.died(start, "m@v1", 100.0 * k, 5.0)
        assert retried.id == start and retried.failures == k
        waits.append(retried.eta - 100.0 * k - 5.0)
    assert waits == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert len(ledger.adding()) == 1  # still one start: a failure asks for no second worker


def test_a_worker_that_dies_once_up_begins_a_restart_of_what_it_held() -> None:
    ledger = Ledger()
    restart = StartId(Origin.RESTART, 7)
    begun = ledger.died(restart, "m@v1", 3.0, 2.0)
    assert (begun.kind, begun.version, begun.eta, begun.failures) == (
        Kind.RESTART, "m@v1", 5.0, 0)
    assert ledger.under_way("m@v1") == 1


def test_a_start_taken_back_is_gone_and_its_late_worker_ends_nothing() -> None:
    ledger = Ledger()
    start = ledger.ask(Kind.ADD, "m@v1", 0.0, 5.0)
    assert ledger.cancel(start) is not None and ledger.cancel(start) is None
    assert ledger.up(start, 4.0) is None and len(ledger) == 0


def test_a_switch_keeps_its_worker_and_goes_when_that_worker_dies_first() -> None:
    ledger = Ledger()
    switch = ledger.ask(Kind.SWITCH, "b@v1", 0.0, 4.0, WorkerId(3), "a@v1")
    assert ledger.adding() == [] and ledger.switches() == 1
    assert ledger.under_way("b@v1") == 1  # placement sends no second load meanwhile
    dropped = ledger.switch_of(WorkerId(3))
    assert dropped is not None and (dropped.id, dropped.held) == (switch, "a@v1")
    assert ledger.switch_of(WorkerId(3)) is None and len(ledger) == 0


def test_the_loads_that_end_are_measured_but_a_restart_holds_its_backoff() -> None:
    ledger = Ledger()
    ledger.up(ledger.first(0, "m@v1", 0.0, 30.0), 10.0)
    assert ledger.measured == {("m@v1", SPAWN): 10.0}
    ledger.up(ledger.ask(Kind.SWITCH, "m@v1", 20.0, 10.0, WorkerId(1), "x@v1"), 40.0)
    assert ledger.measured[("m@v1", SPAWN)] == pytest.approx(0.7 * 10.0 + 0.3 * 20.0)
    restart = StartId(Origin.RESTART, 2)
    ledger.died(restart, "m@v1", 50.0, 10.0)
    ledger.up(restart, 100.0)
    assert ledger.measured[("m@v1", SPAWN)] == pytest.approx(13.0)


def test_each_kind_of_start_is_measured_apart_and_expected_at_its_own_time() -> None:
    ledger = Ledger()
    ledger.up(ledger.first(0, "m@v1", 0.0, 30.0), 8.0, SPAWN)  # the very first start too
    ledger.up(ledger.ask(Kind.ADD, "m@v1", 10.0, 8.0), 10.5, FORK)
    ledger.up(ledger.ask(Kind.SWITCH, "m@v1", 20.0, 8.0, WorkerId(1), "x@v1"), 20.01, WAKE)
    assert ledger.time_of("m@v1", SPAWN) == 8.0
    assert ledger.time_of("m@v1", FORK) == 0.5
    assert ledger.time_of("m@v1", WAKE) == pytest.approx(0.01)
    # Another version never forked nor woken: a wake of any version is the guess, no longer
    # than its own spawn; a fork takes its spawn's (what it loads after the fork is its
    # own); a spawn never measured has no guess.
    ledger.up(ledger.first(1, "n@v1", 0.0, 30.0), 0.2, SPAWN)
    assert ledger.time_of("n@v1", FORK) == 0.2 and ledger.time_of("n@v1", WAKE) == \
        pytest.approx(0.01)
    assert ledger.time_of("o@v1", SPAWN) is None and ledger.time_of("o@v1", WAKE) == \
        pytest.approx(0.01)
    # An attached worker was loaded by an earlier core: nothing of it is measured.
    ledger.up(ledger.ask(Kind.ADD, "o@v1", 30.0, 8.0), 30.0, StartKind.ATTACH)
    assert ledger.time_of("o@v1", SPAWN) is None


def test_residency_expects_the_kind_of_start_the_pool_would_make() -> None:
    kinds = {"m@v1": WAKE}
    residency = Residency(Ledger(), lambda version: 12.0, lambda version: kinds[version])
    assert residency.load_s("m@v1") == 12.0  # nothing measured: the catalogue's hint
    residency.ledger.up(residency.ledger.first(0, "m@v1", 0.0, 12.0), 6.0, SPAWN)
    assert residency.load_s("m@v1") == 6.0  # a wake never seen: no longer than a spawn
    residency.ledger.up(residency.ledger.ask(Kind.ADD, "m@v1", 10.0, 6.0), 10.05, WAKE)
    assert residency.load_s("m@v1") == pytest.approx(0.05)
    kinds["m@v1"] = SPAWN  # its parked worker given up: a spawn again
    assert residency.load_s("m@v1") == 6.0


def test_admission_sees_each_version_s_etas_a_late_one_a_share_from_now_an_overdue_none() -> None:
    ledger = Ledger()
    ledger.ask(Kind.ADD, "m@v1", 0.0, 10.0)  # due at 10
    ledger.ask(Kind.ADD, "m@v1", 8.0, 10.0)  # due at 18
    ledger.ask(Kind.ADD, "x@v1", 0.0, 1.0)
    ledger.ask(Kind.SWITCH, "m@v1", 0.0, 2.0, WorkerId(1), "x@v1")  # keeps its worker
    assert ledger.joining("m@v1", 5.0, 10.0) == (10.0, 18.0)
    assert ledger.joining("m@v1", 12.0, 10.0) == (12.0 + LATE_SHARE * 10.0, 18.0)
    assert ledger.joining("m@v1", 20.5, 10.0) == (20.5 + LATE_SHARE * 10.0,)  # 10 overdue
    assert ledger.next_eta(5.0) == 0.0  # x's is overdue already
    assert ledger.began("m@v1") == 0.0 and ledger.began("y@v1") == math.inf
