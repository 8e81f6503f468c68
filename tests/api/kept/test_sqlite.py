"""`sqlite:PATH`: answers outlive the process that kept them, within their bounds (entries,
bytes, ttl; the oldest leave first), and one server holds the file at a time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from api.kept import (
    Claimed,
    SqliteSettings,
    SqliteState,
    StateLocked,
    StateUnavailable,
    Stored,
    StoredResponse,
    check_state_file,
)
from tests.api.kept.conftest import sqlite_at

pytestmark = pytest.mark.anyio
FP = b"f" * 32


def answer(n: int, size: int = 10) -> StoredResponse:
    return StoredResponse(200, str(n).encode().ljust(size, b"."))


async def kept_keys(state: SqliteState | object, keys: list[str]) -> list[str]:
    assert isinstance(state, SqliteState)
    return [k for k in keys if isinstance(await state.claim("acme", k, FP, 5.0), Stored)]


async def test_answers_outlive_the_state_object_that_kept_them(tmp_path: Path) -> None:
    first = sqlite_at(tmp_path / "kept.db")
    await first.open()
    await first.store("acme", "k-1", FP, answer(1))
    await first.close()
    again = sqlite_at(tmp_path / "kept.db")
    await again.open()
    assert await again.claim("acme", "k-1", FP, 5.0) == Stored(answer(1))
    await again.close()


async def test_past_max_entries_the_oldest_answers_leave_first(tmp_path: Path) -> None:
    state = sqlite_at(tmp_path / "kept.db", max_entries=3)
    await state.open()
    keys = [f"k-{n}" for n in range(5)]
    for n, key in enumerate(keys):
        await state.store("acme", key, FP, answer(n))
    assert await kept_keys(state, keys) == ["k-2", "k-3", "k-4"]
    assert isinstance(state, SqliteState) and state.counts()[0] == 3
    await state.close()


async def test_past_max_bytes_the_oldest_answers_leave_first(tmp_path: Path) -> None:
    one = 700 + 1000  # an answer of 1,000 bytes and what its row costs beside it
    state = sqlite_at(tmp_path / "kept.db", max_bytes=2 * one + 100)
    await state.open()
    keys = [f"k-{n}" for n in range(4)]
    for n, key in enumerate(keys):
        await state.store("acme", key, FP, answer(n, size=1000))
    assert await kept_keys(state, keys) == ["k-2", "k-3"]
    assert isinstance(state, SqliteState) and state.counts()[1] <= 2 * one + 100
    await state.close()


async def test_the_bounds_count_what_the_file_holds_after_a_reopen(tmp_path: Path) -> None:
    state = sqlite_at(tmp_path / "kept.db", max_entries=3)
    await state.open()
    for n in range(3):
        await state.store("acme", f"k-{n}", FP, answer(n))
    await state.close()
    state = sqlite_at(tmp_path / "kept.db", max_entries=3)
    await state.open()
    await state.store("acme", "k-3", FP, answer(3))
    assert await kept_keys(state, [f"k-{n}" for n in range(4)]) == ["k-1", "k-2", "k-3"]
    await state.close()


async def test_an_answer_past_its_ttl_is_not_replayed_and_the_key_runs_again(
        tmp_path: Path) -> None:
    now = [1000.0]
    state = SqliteState(SqliteSettings(tmp_path / "kept.db", ttl=60, max_entries=10,
                                       max_bytes=1 << 20), wall=lambda: now[0])
    await state.open()
    await state.store("acme", "k-1", FP, answer(1))
    now[0] += 59.9
    assert await state.claim("acme", "k-1", FP, 5.0) == Stored(answer(1))
    now[0] += 0.2
    assert isinstance(await state.claim("acme", "k-1", FP, 5.0), Claimed)
    assert await state.store("acme", "k-1", FP, answer(2)) == answer(2)  # a new first
    assert state.counts()[0] == 1
    await state.close()


async def test_a_second_server_on_the_same_file_is_refused(tmp_path: Path) -> None:
    first = sqlite_at(tmp_path / "kept.db")
    await first.open()
    with pytest.raises(StateLocked, match="one server per state file"):
        await sqlite_at(tmp_path / "kept.db").open()
    await first.close()
    second = sqlite_at(tmp_path / "kept.db")
    await second.open()  # the lock went with the first
    await second.close()


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def lock_holder(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another process holding the file's lock, as a server does; ended by its pid."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, f"{tmp_path / 'kept.db'}.lock"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)


async def test_the_lock_of_a_killed_server_is_free_at_once(
        tmp_path: Path, lock_holder: subprocess.Popen[bytes]) -> None:
    with pytest.raises(StateLocked):
        await sqlite_at(tmp_path / "kept.db").open()
    os.kill(lock_holder.pid, signal.SIGKILL)
    state = SqliteState(SqliteSettings(tmp_path / "kept.db", ttl=60, max_entries=10,
                                       max_bytes=1 << 20, lock_wait=5.0))
    with anyio.fail_after(5):
        await state.open()  # waits `lock_wait` at most for the kernel to let go
    await state.close()


async def test_a_file_that_is_not_a_database_is_unavailable_not_a_crash(
        tmp_path: Path) -> None:
    (tmp_path / "kept.db").write_bytes(b"not a database, " * 100)
    with pytest.raises(StateUnavailable, match="cannot open"):
        await sqlite_at(tmp_path / "kept.db").open()
    (tmp_path / "kept.db").unlink()
    state = sqlite_at(tmp_path / "kept.db")
    await state.open()  # the failed open let go of the lock
    await state.close()


async def test_a_call_on_a_closed_file_is_unavailable(tmp_path: Path) -> None:
    state = sqlite_at(tmp_path / "kept.db")
    await state.open()
    await state.close()
    with pytest.raises(StateUnavailable):
        await state.claim("acme", "k-1", FP, 5.0)
    with pytest.raises(StateUnavailable):
        await state.store("acme", "k-1", FP, answer(1))


async def test_a_file_overwritten_under_a_running_server_fails_every_call(
        tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    state = sqlite_at(path)
    await state.open()
    await state.store("acme", "k-1", FP, answer(1))
    await state.check()  # the file opened: quiet
    path.write_bytes(os.urandom(8192))  # SQLite alone would go on answering from its WAL
    with pytest.raises(StateUnavailable, match="no SQLite database"):
        await state.check()
    with pytest.raises(StateUnavailable, match="no SQLite database"):
        await state.claim("acme", "k-1", FP, 5.0)
    await state.close()


async def test_a_file_replaced_under_a_running_server_fails_every_call(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    state = sqlite_at(path)
    await state.open()
    path.unlink()
    path.write_bytes(b"")
    with pytest.raises(StateUnavailable, match="was replaced"):
        await state.check()
    with pytest.raises(StateUnavailable, match="was replaced"):
        await state.store("acme", "k-1", FP, answer(1))
    await state.close()


def test_a_file_that_cannot_be_opened_is_found_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(StateUnavailable, match=r"folder\.db"):
        check_state_file(tmp_path / "folder.db")
    (tmp_path / "garbage.db").write_bytes(os.urandom(8192))
    with pytest.raises(StateUnavailable, match=r"garbage\.db: file is not a database"):
        check_state_file(tmp_path / "garbage.db")
    with pytest.raises(StateUnavailable, match="lock"):
        check_state_file(tmp_path / "missing" / "kept.db")
    check_state_file(tmp_path / "new.db")  # made, and free for the server to open


def filled(state: SqliteState) -> None:
    """The file can no longer grow: what a full disk does to every write that needs room
    (SQLite's page bound raises SQLITE_FULL as the disk would)."""
    db = state._db
    assert db is not None
    db.execute(f"PRAGMA max_page_count={db.execute('PRAGMA page_count').fetchone()[0]}")


async def test_a_file_that_cannot_grow_refuses_the_claim_before_the_run(
        tmp_path: Path) -> None:
    state = sqlite_at(tmp_path / "kept.db")
    await state.open()
    await state.store("acme", "k-0", FP, answer(0))
    assert isinstance(state, SqliteState)
    filled(state)
    with pytest.raises(StateUnavailable, match="full"):  # before: Claimed, then the run
        await state.claim("acme", "k-1", FP, 5.0)
    assert await state.claim("acme", "k-0", FP, 5.0) == Stored(answer(0))  # still read
    await state.close()


async def test_a_claim_given_up_or_answered_leaves_nothing_behind(tmp_path: Path) -> None:
    state = sqlite_at(tmp_path / "kept.db")
    await state.open()
    assert isinstance(state, SqliteState) and state._db is not None
    assert isinstance(await state.claim("acme", "k-1", FP, 5.0), Claimed)
    assert isinstance(await state.claim("acme", "k-2", FP, 5.0), Claimed)
    assert state._db.execute("SELECT count(*) FROM claims").fetchone() == (2,)
    await state.release("acme", "k-1", "")
    await state.store("acme", "k-2", FP, answer(2))
    assert state._db.execute("SELECT count(*) FROM claims").fetchone() == (0,)
    assert state.counts()[0] == 1
    await state.close()


async def test_the_file_gives_the_room_of_expired_answers_back_to_the_disk(
        tmp_path: Path) -> None:
    path, now = tmp_path / "kept.db", [1000.0]
    state = SqliteState(SqliteSettings(path, ttl=60, max_entries=1000, max_bytes=1 << 24,
                                       lock_wait=0.2), wall=lambda: now[0])
    await state.open()
    for n in range(200):
        await state.store("acme", f"k-{n}", FP, answer(n, size=4000))
    await state.close()  # the last connection's close checkpoints the WAL into the file
    full = path.stat().st_size
    assert full > 200 * 4000
    now[0] += 120  # every answer expired
    await state.open()  # sweeps them
    await state.store("acme", "k-new", FP, answer(1))
    await state.close()
    assert path.stat().st_size < full / 10  # before: the file kept its size, pages free


async def test_a_file_whose_header_is_broken_is_refused_though_its_wal_would_open(
        tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    running = sqlite_at(path)
    await running.open()
    await running.store("acme", "k-1", FP, answer(1))  # in the WAL, not yet in the file
    path.write_bytes(b"no database " * 1000)
    assert isinstance(running, SqliteState) and running._lock is not None
    os.close(running._lock)  # as a core killed now leaves it: the lock gone, the WAL kept
    running._lock = None
    again = sqlite_at(path)
    with pytest.raises(StateUnavailable, match="no SQLite database"):
        await again.open()  # before: opened, every page read from the WAL
    await running.close()
