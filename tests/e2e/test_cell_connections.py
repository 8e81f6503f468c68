"""`--max-connections` in a cell holds for the whole server, whichever gateway the kernel
hands each connection to, a dead gateway's connections stop counting, and the kernel
spreads the connections over the gateways."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from loadtest.server import RunningServer, running_server
from tests.e2e.helpers import EXAMPLE_KEYS

pytestmark = pytest.mark.e2e
LIMIT = 20
ADMIN = {"Authorization": "Bearer admin-demo-key"}


@pytest.fixture
def gateways() -> int:
    """This module starts its own cells: no single-process variant."""
    return 2


@pytest.fixture
def cell() -> Iterator[RunningServer]:
    args = ["--gateways", "2", "--max-connections", str(LIMIT), "--keys", str(EXAMPLE_KEYS)]
    with running_server(workers=1, args=args) as srv:
        yield srv


def health(sock: socket.socket) -> int | None:
    """GET /healthz on a held connection: the gateway that holds it, or None when the
    connection was refused (503 too_many_connections, then closed)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    if head.startswith(b"HTTP/1.1 503"):
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        return None
    assert head.startswith(b"HTTP/1.1 200"), head
    return int(json.loads(body)["gateway"])


def connect(srv: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=10)


def hold(srv: RunningServer, per_gateway: int) -> dict[int, list[socket.socket]]:
    """`per_gateway` idle keep-alive connections held by each of the two gateways; the
    connections the kernel hands to a gateway that has its share are closed again."""
    held: dict[int, list[socket.socket]] = {0: [], 1: []}
    deadline = time.monotonic() + 30
    while min(len(s) for s in held.values()) < per_gateway:
        assert time.monotonic() < deadline, {g: len(s) for g, s in held.items()}
        sock = connect(srv)
        slot = health(sock)
        if slot is not None and len(held[slot]) < per_gateway:
            held[slot].append(sock)
        else:  # refused while an extra's close is not yet seen, or a full gateway's
            sock.close()
    return held


def admitted(srv: RunningServer) -> socket.socket:
    """A new connection the server holds, once it has a place for one (polled, bounded)."""
    deadline = time.monotonic() + 10
    while True:
        sock = connect(srv)
        if health(sock) is not None:
            return sock
        sock.close()
        assert time.monotonic() < deadline, "no place came free"


def refused(srv: RunningServer, n: int) -> int:
    """Open `n` more connections at once; how many of them the server refused."""
    socks = [connect(srv) for _ in range(n)]
    try:
        return sum(health(sock) is None for sock in socks)
    finally:
        for sock in socks:
            sock.close()


def test_held_connections_spread_over_both_gateways() -> None:
    """Each gateway listens on a socket of its own (SO_REUSEPORT) and the kernel hashes the
    connections over them; on one shared socket the gateway that woke first took nearly
    every connection queued (20 of 20, 38 of 40). Hashed over two, fewer than 9 of 40 on
    one gateway happens about once in 6,000 runs."""
    held = 2 * LIMIT
    args = ["--gateways", "2", "--max-connections", str(held)]
    with running_server(workers=1, args=args) as srv:
        socks = [connect(srv) for _ in range(held)]  # all queued before any is served
        try:
            slots = Counter(health(sock) for sock in socks)
        finally:
            for sock in socks:
                sock.close()
    assert None not in slots and min(slots[0], slots[1]) >= 9, slots


def test_the_connection_limit_holds_for_the_whole_cell(cell: RunningServer) -> None:
    held = hold(cell, LIMIT // 2)  # each gateway holds half the limit: the cell is full
    try:
        assert refused(cell, 10) == 10
        held[0].pop().close()  # one place comes free, on either gateway
        held[0].append(admitted(cell))
        assert refused(cell, 1) == 1
    finally:
        for sock in held[0] + held[1]:
            sock.close()


def test_a_dead_gateways_connections_stop_counting(cell: RunningServer) -> None:
    victim = httpx.get(cell.url + "/admin/workers", headers=ADMIN).json()["gateways"][1]["pid"]
    held = hold(cell, LIMIT // 2)
    try:
        os.kill(victim, signal.SIGKILL)  # its ten connections die with it
        for sock in held[1]:
            sock.close()
        # Its places come free once the core sees it die, before it is started again.
        held[1] = [admitted(cell) for _ in range(LIMIT // 2)]
        for sock in held[0]:
            assert health(sock) == 0  # still held: the cell is full again
        assert refused(cell, 1) == 1
    finally:
        for sock in held[0] + held[1]:
            sock.close()
