"""The count `--max-connections` is held to: one process's, and a cell's shared tally."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from fcntl import LOCK_EX, lockf
from pathlib import Path

from api.http import CellConnections, ConnectionTally, LocalConnections


def test_a_process_holds_up_to_its_limit_and_a_place_left_is_taken_again() -> None:
    count = LocalConnections(2)
    assert [count.enter() for _ in range(3)] == [True, True, False]
    count.leave()
    assert count.enter() and count.held() == 2


def test_the_gateways_of_a_cell_share_one_limit(tmp_path: Path) -> None:
    tally = ConnectionTally.create(tmp_path / "connections", slots=2)
    gateway0, gateway1 = (CellConnections(ConnectionTally(tmp_path / "connections"), slot, 3)
                          for slot in (0, 1))  # each maps the file for itself
    assert [gateway0.enter() for _ in range(2)] == [True, True]
    assert [gateway1.enter() for _ in range(2)] == [True, False]
    gateway0.leave()
    assert gateway1.enter() and not gateway0.enter()
    assert tally.held() == 3


def test_a_dead_gateways_share_is_forgotten(tmp_path: Path) -> None:
    tally = ConnectionTally.create(tmp_path / "connections", slots=2)
    for _ in range(3):
        assert tally.enter(1, limit=3)
    assert not tally.enter(0, limit=3)
    tally.forget(1)
    assert tally.held() == 0 and tally.enter(0, limit=3)


def die_holding_the_lock(path: Path) -> None:
    """A gateway killed while it counts: two places taken, the lock held."""
    tally = ConnectionTally(path)
    tally.enter(1, limit=10)
    tally.enter(1, limit=10)
    lockf(os.open(path, os.O_RDWR), LOCK_EX)  # a process's record locks are all one
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_gateway_killed_holding_the_lock_does_not_stop_the_others(tmp_path: Path) -> None:
    tally = ConnectionTally.create(tmp_path / "connections", slots=2)
    child = multiprocessing.get_context("spawn").Process(
        target=die_holding_the_lock, args=(tmp_path / "connections",))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    entered: list[bool] = []
    thread = threading.Thread(target=lambda: entered.append(tally.enter(0, limit=10)),
                              daemon=True)
    thread.start()
    thread.join(timeout=10)  # the kernel dropped the dead process's lock
    assert entered == [True] and tally.held() == 3
    tally.forget(1)
    assert tally.held() == 1
