"""The HTTP surface leaves nothing to a guess (issue 40, items 13, 14, 18 and 22), on a real
server, a single process and a cell of two gateways: a key never appears raw outside the keys
file; a path with a slash too many is a JSON 404, never a redirect built from the request's
Host; an HTTP/1.1 request without a Host, or with two Authorization headers, is a JSON 400
(raw sockets: no client sends them); an admin body over the limit is refused before it is
read; a keyed answer is counted and timed by the version that ran it."""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from collections.abc import Iterator

import httpx
import pytest

from loadtest.server import RunningServer, fetch_metrics, metric, running_server
from tests.e2e.helpers import logged, metric_reaches

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
SECRET = "raw-secret-key-0123"  # a keys entry without an account
KEY = {"Authorization": f"Bearer {SECRET}"}
ADMIN = b"Authorization: Bearer admin-demo-key\r\n"
BODY = b'{"input": "abc"}'
LIMIT = 1_048_576  # --max-body-bytes' default


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'[admin]\nkeys = ["admin-demo-key"]\n'
                    f'[[keys]]\nkey = "{SECRET}"\ntier = "paid"\n')
    keys.chmod(0o600)
    with running_server(workers=1, args=["--keys", str(keys), "--access-log", "json"]) as srv:
        yield srv


def exchange(srv: RunningServer, data: bytes, timeout_s: float = 10) -> tuple[int, bytes]:
    """Send `data` on a fresh connection; the status and body of the answer (the server
    closes after each refusal), or socket.timeout if none comes."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout_s) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


def test_a_key_without_an_account_is_logged_by_its_hash_never_itself(
        server: RunningServer) -> None:
    r = httpx.post(server.url + "/v1/batchstring", json={"input": "abc"}, headers=KEY)
    assert r.status_code == 200, r.text
    line = logged(server, r.json()["id"])
    assert line["account"] == "key-" + hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    assert SECRET not in server.log_path.read_text()


@pytest.mark.parametrize("path", ["/v1/batchstring/", "/healthz/"])
def test_a_path_with_a_slash_too_many_is_a_json_404_never_a_redirect(
        server: RunningServer, path: str) -> None:
    r = httpx.request("POST" if "batch" in path else "GET", server.url + path,
                      json={"input": "abc"}, headers={"Host": "evil.example"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert "location" not in r.headers


@pytest.mark.parametrize("head", [
    b"POST /v1/batchstring HTTP/1.1\r\nContent-Length: %d\r\n" % len(BODY),  # the direct way
    b"GET /readyz HTTP/1.1\r\n",  # Starlette's
], ids=["hot-route", "other-path"])
def test_an_http11_request_without_host_is_a_json_400(server: RunningServer,
                                                       head: bytes) -> None:
    status, body = exchange(server, head + b"\r\n" + (BODY if b"POST" in head else b""))
    assert (status, code(body)) == (400, "invalid_host")


@pytest.mark.parametrize("request_", [
    b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + SECRET.encode()
    + b"\r\nAuthorization: Bearer other\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
    b"GET /admin/models HTTP/1.1\r\nHost: t\r\n" + ADMIN + b"Authorization: Bearer other"
    b"\r\n\r\n",
], ids=["hot-route", "admin"])
def test_two_authorization_headers_are_a_json_400(server: RunningServer,
                                                  request_: bytes) -> None:
    status, body = exchange(server, request_)
    assert (status, code(body)) == (400, "repeated_header")


PUT = b"PUT /admin/models/default HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"


def test_an_admin_body_declared_over_the_limit_is_refused_before_it_arrives(
        server: RunningServer) -> None:
    status, body = exchange(server, PUT + ADMIN + b"Content-Length: %d\r\n\r\n" % (LIMIT * 100))
    assert (status, code(body)) == (413, "body_too_large")


def test_a_chunked_admin_body_is_refused_once_past_the_limit_not_at_its_end(
        server: RunningServer) -> None:
    chunk = b" " * 65536
    over = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * (LIMIT // len(chunk) + 1)
    status, body = exchange(server, PUT + ADMIN + b"Transfer-Encoding: chunked\r\n\r\n" + over)
    assert (status, code(body)) == (413, "body_too_large")


async def test_a_keyed_answer_is_counted_and_timed_by_the_version_that_ran_it(
        server: RunningServer) -> None:
    ran = {"name": "batchgate_requests_total", "tier": "paid", "code": "200"}
    before = fetch_metrics(server.url)
    versioned = metric(before, **ran, model="default", version="v1")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        r = await client.post("/v1/batchstring", json={"input": "keyed"},
                              headers={**KEY, "Idempotency-Key": uuid.uuid4().hex})
    assert r.status_code == 200 and r.json()["model"] == "default@v1"
    queue, batch = r.headers["server-timing"].split(", ")
    assert queue.startswith("queue;dur=") and batch.startswith("batch;dur=")
    await metric_reaches(server.url, versioned + 1, **ran, model="default", version="v1")
    after = fetch_metrics(server.url)
    assert metric(after, **ran, model="", version="") == metric(
        before, **ran, model="", version="")
