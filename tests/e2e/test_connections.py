"""Limits at the door, over raw sockets against the real server: idle and slow clients are
cut off, oversized heads refused, connections bounded, and normal clients served meanwhile."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from loadtest.server import RunningServer, running_server

pytestmark = pytest.mark.e2e
LIMITS = ["--head-timeout-s", "1", "--body-timeout-s", "1"]
HEAD = b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server(workers=1, args=LIMITS) as srv:
        yield srv


def connect(srv: RunningServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    return sock


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response to the end (the server closes after each refusal)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


def served(srv: RunningServer) -> bool:
    r = httpx.post(srv.url + "/v1/batchstring", json={"input": "still here"}, timeout=10)
    return r.status_code == 200 and r.json()["output"] == "ereh llits"


def dribble(sock: socket.socket, data: bytes, every_s: float = 0.2) -> threading.Thread:
    """Send `data` one byte at a time, as a slow (or hostile) client does, until the server
    closes the connection."""

    def run() -> None:
        for i in range(len(data)):
            try:
                sock.send(data[i:i + 1])
            except OSError:
                return
            time.sleep(every_s)  # the client's pace is the subject of the test

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_idle_connection_is_closed_after_the_head_timeout(server: RunningServer) -> None:
    with connect(server) as idle:
        opened = time.monotonic()
        assert served(server)  # others are served meanwhile
        assert idle.recv(1024) == b""  # closed quietly: there was nothing to answer
        # ...by the server, not before its head timeout (the socket's own 10 s would raise).
        assert time.monotonic() - opened >= 0.9


def test_a_head_sent_byte_by_byte_is_answered_408(server: RunningServer) -> None:
    with connect(server) as slow:
        dribble(slow, HEAD + b"Content-Length: 2\r\n\r\n{}")
        status, headers, body = answer(slow)
    assert (status, code(body), headers["connection"]) == (408, "request_timeout", "close")
    assert served(server)


def test_a_keep_alive_connection_s_next_head_is_timed_from_its_first_byte(
    server: RunningServer,
) -> None:
    body = json.dumps({"input": "one"}).encode()
    with connect(server) as sock:
        sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        first = b""
        while b'"eno"' not in first:  # the whole first answer; the connection stays open
            first += sock.recv(65536) or pytest.fail(f"closed after {first!r}")
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /v1/batch")  # the next request begins, and stalls
        status, _, reply = answer(sock)
    assert (status, code(reply)) == (408, "request_timeout")


def test_a_body_sent_byte_by_byte_is_answered_408(server: RunningServer) -> None:
    body = json.dumps({"input": "x" * 40}).encode()
    with connect(server) as slow:
        slow.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body))
        dribble(slow, body)
        status, _, reply = answer(slow)
    assert (status, code(reply)) == (408, "request_timeout")
    assert served(server)


@pytest.mark.parametrize("extra", [
    b"".join(b"X-Filler-%d: v\r\n" % i for i in range(200)),  # too many headers
    b"X-Huge: " + b"h" * 40_000 + b"\r\n",  # one header over the byte limit
    b"".join(b"X-Filler-%d: %s\r\n" % (i, b"v" * 200) for i in range(90)),  # many long ones
])
def test_an_oversized_head_is_answered_431(server: RunningServer, extra: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(HEAD + extra + b"Content-Length: 2\r\n\r\n{}")
        status, _, body = answer(sock)
    assert (status, code(body)) == (431, "headers_too_large")
    assert served(server)


def test_a_head_within_the_limits_is_served(server: RunningServer) -> None:
    extra = b"".join(b"X-Filler-%d: v\r\n" % i for i in range(90))
    body = json.dumps({"input": "ok"}).encode()
    with connect(server) as sock:
        sock.sendall(HEAD + extra + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        status, _, reply = answer(sock)
    assert status == 200 and json.loads(reply)["output"] == "ko"


def test_connections_past_the_limit_are_refused_503_and_come_back(gateways: int) -> None:
    limit = 4
    with running_server(workers=1, args=["--max-connections", str(limit)]) as srv:
        # Each gateway holds at most `limit`: one more than all of them hold is refused.
        socks = [connect(srv) for _ in range(gateways * limit + 1)]
        try:
            request = HEAD + b"Content-Length: 15\r\n\r\n" + b'{"input": "ab"}'
            for sock in socks:
                sock.sendall(request)
            outcomes = []
            for sock in socks:
                sock.settimeout(10)
                data = sock.recv(65536)
                outcomes.append(int(data.split(b" ", 2)[1]))
                if outcomes[-1] == 503:
                    assert b"too_many_connections" in data and b"retry-after: 1" in data
            assert outcomes.count(503) >= 1 and outcomes.count(200) <= gateways * limit
            assert set(outcomes) <= {200, 503}
        finally:
            for sock in socks:
                sock.close()
        deadline = time.monotonic() + 10
        while not served(srv):  # the server sees the closes in its own time
            assert time.monotonic() < deadline, "never served again"
