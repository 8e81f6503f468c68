"""`--state sqlite:PATH`: kept answers in an embedded file, so a key's answer outlives the
core process and the whole server.

One server per file, held by an exclusive lock on `PATH.lock` for as long as it is open
(the kernel drops it when the process dies, however it dies). So the memory store in front
(`BackedStore`) already lets one request per key lead, and a claim left by a dead core is
stale by definition: opening the file drops every claim in it.

A claim is still written, before the model runs: it holds room for its answer
(`RESERVE` bytes, given back to the answer when it is stored, or by `release`), so a file
that cannot be written or cannot grow (a full disk) refuses the request before any work
(StateUnavailable), instead of after the run, when its answer cannot be kept.

The file is in WAL mode with `synchronous=NORMAL`: a commit is in the file before `store`
returns, so it survives the process being killed (a power cut may lose the last commits).
Each call is one short indexed statement run on the event loop: handing it to a thread
costs more than the statement (`loadtest/bench_state.py` measures both).

A file that cannot be opened is found at start-up, before any model loads
(`check_state_file`); one broken under a running server (replaced, removed, overwritten:
SQLite may go on reading what its WAL holds) is found by `check`, which its owner calls
every second: from then on every call raises StateUnavailable, as when a Redis cannot be
reached, until the file is a database again.

Bounds, like the memory store's: at most `max_entries` answers and `max_bytes` of them,
each for `ttl` seconds of wall-clock time (it outlives the process, so not the monotonic
clock); the oldest leave first. The file is in incremental auto-vacuum (a file made
before is vacuumed once when opened), and the pages that evicted and expired answers free
go back to the disk, so the bound holds for the file, not only for what it counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import orjson

from api.kept.errors import IdempotencyMismatch, StateLocked, StateUnavailable
from api.kept.idempotency import ENTRY_OVERHEAD, StoredResponse
from api.kept.seam import Claim, Claimed, Stored
from api.kept.spec import SqliteSettings

HEADER = b"SQLite format 3\x00"  # the first bytes of every SQLite database file
SWEEP_S = 1.0  # expired answers are deleted at most this often (they are never replayed)
T = TypeVar("T")
EVICT_CHUNK = 64  # answers evicted per statement when over a bound
RESERVE = 4096  # bytes a claim holds: more than a page, so a file that cannot grow refuses it
INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
SCHEMA = """
CREATE TABLE IF NOT EXISTS kept (
    id INTEGER PRIMARY KEY,  -- insertion order: oldest first
    scope TEXT NOT NULL, key TEXT NOT NULL, fingerprint BLOB NOT NULL,
    status INTEGER NOT NULL, body BLOB NOT NULL, headers BLOB NOT NULL,
    expires REAL NOT NULL, cost INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS kept_key ON kept (scope, key);
CREATE INDEX IF NOT EXISTS kept_expires ON kept (expires);
CREATE TABLE IF NOT EXISTS claims (
    scope TEXT NOT NULL, key TEXT NOT NULL, expires REAL NOT NULL, room BLOB NOT NULL,
    PRIMARY KEY (scope, key)
);
DELETE FROM claims;  -- a claim in the file at its opening was left by a dead process
"""


class SqliteState:
    """`KeptState` on one SQLite file. Not thread-safe: call it from the loop."""

    def __init__(self, settings: SqliteSettings, wall: Callable[[], float] = time.time
                 ) -> None:
        self._settings, self._wall = settings, wall
        self._db: sqlite3.Connection | None = None
        self._lock: int | None = None
        self._entries = self._bytes = 0
        self._swept = float("-inf")
        self._freed = False  # answers were deleted since the last vacuum
        self._inode: tuple[int, int] | None = None  # the file opened (device, inode)
        self._broken: str | None = None  # why the file on disk is no longer usable

    async def open(self) -> None:
        """Take the file's lock (waiting `lock_wait` for an exiting server), then open it.

        Raises StateLocked if another server holds it, StateUnavailable if it cannot be
        opened."""
        path = self._settings.path
        self._lock = await _locked(Path(f"{path}.lock"), self._settings.lock_wait)
        try:
            db, self._entries, self._bytes = _opened(path)
            try:  # a file with a broken header may still open: SQLite reads the WAL's pages
                broken = _broken(path, inode := _inode(path))
            except OSError as exc:
                broken = f"the state file {path} cannot be read: {exc.strerror or exc}"
            if broken is not None:
                db.close()
                raise StateUnavailable(broken)
        except StateUnavailable:
            await self.close()
            raise
        self._db, self._inode, self._broken = db, inode, None
        self._sweep(self._wall())
        self._vacuum(db)

    async def check(self) -> None:
        """Whether the file on disk is still the database opened: StateUnavailable saying
        why not (every call raises it meanwhile); quiet again once it is."""
        self._broken = _broken(self._settings.path, self._inode)  # a stat and 16 bytes
        if self._broken is not None:
            raise StateUnavailable(self._broken)

    async def claim(self, scope: str, key: str, fingerprint: bytes, lease: float,
                    within: float | None = None) -> Claim:
        """The kept answer, or a claim written (holding `RESERVE` bytes) before it runs
        (`within` does not apply: a statement on the file is not waited for)."""
        return self._call(lambda db: self._claim(db, scope, key, fingerprint, lease))

    async def store(self, scope: str, key: str, fingerprint: bytes,
                    response: StoredResponse, within: float | None = None) -> StoredResponse:
        return self._call(lambda db: self._store(db, scope, key, fingerprint, response))

    async def release(self, scope: str, key: str, token: str) -> None:
        """Give the claim's room back (a stored answer has taken it already)."""
        self._call(lambda db: db.execute(
            "DELETE FROM claims WHERE scope = ? AND key = ?", (scope, key)))

    async def extend(self, scope: str, key: str, token: str, lease: float) -> None:
        """Nothing to hold: one server per file, so nobody else takes a claim over."""

    async def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock is not None:
            os.close(self._lock)  # drops the lock
            self._lock = None

    def counts(self) -> tuple[int, int]:
        """(answers, bytes) kept in the file, as the bounds count them."""
        return self._entries, self._bytes

    def _claim(self, db: sqlite3.Connection, scope: str, key: str, fingerprint: bytes,
               lease: float) -> Claim:
        now = self._wall()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT fingerprint, status, body, headers FROM kept "
                "WHERE scope = ? AND key = ? AND expires > ?", (scope, key, now)).fetchone()
            if row is None:
                db.execute("INSERT OR REPLACE INTO claims (scope, key, expires, room) "
                           "VALUES (?, ?, ?, zeroblob(?))", (scope, key, now + lease, RESERVE))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return Claimed("") if row is None else Stored(_answer(row, fingerprint))

    def _store(self, db: sqlite3.Connection, scope: str, key: str, fingerprint: bytes,
               response: StoredResponse) -> StoredResponse:
        now = self._wall()
        headers = orjson.dumps(response.headers)
        cost = ENTRY_OVERHEAD + len(response.body) + len(headers) + len(scope) + len(key) \
            + len(fingerprint)
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM claims WHERE scope = ? AND key = ?", (scope, key))
            winner = db.execute(
                "SELECT fingerprint, status, body, headers, expires, cost FROM kept "
                "WHERE scope = ? AND key = ?", (scope, key)).fetchone()
            if winner is not None and winner[4] > now:
                db.execute("COMMIT")
                return _answer(winner, fingerprint)  # outside the transaction: it is over
            if winner is not None:  # expired, not yet swept
                db.execute("DELETE FROM kept WHERE scope = ? AND key = ?", (scope, key))
                self._forget(1, winner[5])
            db.execute(
                "INSERT INTO kept (scope, key, fingerprint, status, body, headers, expires, "
                "cost) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (scope, key, fingerprint, response.status, response.body, headers,
                 now + self._settings.ttl, cost))
            self._entries += 1
            self._bytes += cost
            self._bound(db, now)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
                self._reload(db)
            raise
        self._vacuum(db)
        return response

    def _bound(self, db: sqlite3.Connection, now: float) -> None:
        if now - self._swept >= SWEEP_S:
            self._sweep(now)
        settings = self._settings
        while self._entries > settings.max_entries or self._bytes > settings.max_bytes:
            over = max(1, min(self._entries - settings.max_entries, EVICT_CHUNK))
            costs = db.execute("DELETE FROM kept WHERE id IN (SELECT id FROM kept ORDER BY id "
                               "LIMIT ?) RETURNING cost", (over,)).fetchall()
            if not costs:
                break
            self._forget(len(costs), sum(c for (c,) in costs))

    def _sweep(self, now: float) -> None:
        assert self._db is not None
        self._swept = now
        costs = self._db.execute("DELETE FROM kept WHERE expires <= ? RETURNING cost",
                                 (now,)).fetchall()
        self._db.execute("DELETE FROM claims WHERE expires <= ?", (now,))
        self._forget(len(costs), sum(c for (c,) in costs))

    def _forget(self, entries: int, cost: int) -> None:
        self._entries -= entries
        self._bytes -= cost
        self._freed = self._freed or entries > 0

    def _vacuum(self, db: sqlite3.Connection) -> None:
        """The pages that deleted answers freed, back to the disk (outside a transaction:
        a script runs the pragma to its end, and commits what is pending first)."""
        if self._freed:
            try:
                db.executescript("PRAGMA incremental_vacuum")
                self._freed = False
            except sqlite3.Error:  # the answer is kept: the next write tries again
                pass

    def _reload(self, db: sqlite3.Connection) -> None:
        """The counts as the file has them, after a rolled-back write."""
        with contextlib.suppress(sqlite3.Error):  # else the next write corrects them
            self._entries, self._bytes = db.execute(
                "SELECT count(*), coalesce(sum(cost), 0) FROM kept").fetchone()

    def _call(self, run: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            raise StateUnavailable("the state file is not open")
        if self._broken is not None:
            raise StateUnavailable(self._broken)
        try:
            return run(self._db)
        except sqlite3.Error as exc:
            raise StateUnavailable(f"the state file failed: {exc}") from exc


def _answer(row: tuple[bytes, int, bytes, bytes], fingerprint: bytes) -> StoredResponse:
    if row[0] != fingerprint:
        raise IdempotencyMismatch("this idempotency key was used with another request")
    headers = tuple((str(k), str(v)) for k, v in orjson.loads(row[3]))
    return StoredResponse(row[1], bytes(row[2]), headers)


def check_state_file(path: Path) -> None:
    """Whether `path` opens as a state file, asked at start-up before any model loads
    (creating it if new): StateUnavailable naming the file and why not. A file another
    server holds is left alone (`SqliteState.open` waits for it, or says so)."""
    fd = _lock_file(Path(f"{path}.lock"))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        db, _, _ = _opened(path)
        db.close()
    finally:
        os.close(fd)


def _opened(path: Path) -> tuple[sqlite3.Connection, int, int]:
    """The file opened as a state file, and its (answers, bytes)."""
    db = None
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        if db.execute("PRAGMA auto_vacuum").fetchone()[0] != INCREMENTAL:
            db.execute(f"PRAGMA auto_vacuum={INCREMENTAL}")
            db.execute("VACUUM")  # a file made before: its mode changes only by a vacuum
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        entries, cost = db.execute("SELECT count(*), coalesce(sum(cost), 0) FROM kept"
                                   ).fetchone()
    except sqlite3.Error as exc:
        if db is not None:
            db.close()
        raise StateUnavailable(f"cannot open the state file {path}: {exc}") from None
    return db, entries, cost


def _broken(path: Path, inode: tuple[int, int] | None) -> str | None:
    """Why the file at `path` is not the database opened as `inode` (None: it is)."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(HEADER))
        same = _inode(path) == inode
    except OSError as exc:
        return f"the state file {path} cannot be read: {exc.strerror or exc}"
    if not same:
        return f"the state file {path} was replaced"
    return None if head in (HEADER, b"") else f"the state file {path} is no SQLite database"


def _inode(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _lock_file(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StateUnavailable(f"cannot open the state file's lock {path}: "
                               f"{exc.strerror or exc}") from None


async def _locked(path: Path, wait: float) -> int:
    """An fd holding `path`'s exclusive lock; polls while another process holds it (one
    that is exiting lets go when the kernel ends it)."""
    fd = _lock_file(path)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise StateLocked(f"another server holds {path} (one server per state file)"
                                  ) from None
            await anyio.sleep(0.05)  # another process's lock: poll it


__all__ = ["SqliteState", "check_state_file"]
