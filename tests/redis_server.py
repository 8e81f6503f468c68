"""A real redis-server for the tests of `--state redis://`: started on a free loopback port in
a folder of the test's, stopped (and started again on the same port) by the test, ended by
its pid. Debian's `redis-server` package provides it; CI installs it (`.ci/run`), and with
BATCHGATE_REQUIRE_REDIS=1 a missing server fails the tests instead of skipping them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

START_TIMEOUT_S = 10.0


def redis_server_binary() -> str:
    """The server's path; skips the test where it is missing (fails under CI's demand)."""
    found = shutil.which("redis-server")
    if found is None:
        if os.environ.get("BATCHGATE_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process, bound to 127.0.0.1, persisting nothing."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port),
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start; see {self.folder}/redis.log")
            time.sleep(0.02)  # another process: poll it

    def answers(self) -> bool:
        """Whether the server answers PING."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """End the server by its pid (SIGKILL: what a crash looks like to its clients)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


__all__ = ["RedisServer", "free_port", "redis_server_binary", "running_redis"]
