"""What the door reads strictly: a request uvicorn's parser rejects is a JSON 400 like every
other error, a transfer coding other than plain `chunked` is refused, an HTTP/1.1 request
names exactly one Host and each header the server reads at most once, and the timeout and
Idempotency-Key headers take only the characters README names."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from api.config import Settings, load_keys
from api.errors import ApiError
from api.http import Routes, parse_timeout
from api.metrics import Metrics
from tests.api.serving import echoing, serving

KEYS = load_keys(Path(__file__).parents[3] / "examples" / "keys.toml")
PAID = KEYS.identify("Bearer paid-demo-key")
HEAD = b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


echo = echoing(b"echo:")


async def exchange(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` to a real uvicorn server; its answer, read until the server closes."""
    async with serving(echo) as port:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await stream.send(data)
        received = b""
        with anyio.fail_after(10):
            while True:
                try:
                    received += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        await stream.aclose()
    head, _, body = received.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status.split()[1]), headers, body


# -- what uvicorn's parser refuses is answered in JSON ------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("request_", [
    HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    HEAD + b"X-Nul: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
], ids=["duplicate-length", "length-and-chunked", "bad-chunk-size", "nul-in-header"])
async def test_a_request_the_parser_refuses_is_a_json_400_and_closes(request_: bytes) -> None:
    status, headers, body = await exchange(request_)
    assert (status, headers["content-type"]) == (400, "application/json")
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "invalid_request"


# -- transfer codings ---------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("coding", [b"gzip, chunked", b"identity, chunked", b"chunked, chunked"])
async def test_a_transfer_coding_other_than_chunked_is_refused(coding: bytes) -> None:
    request_ = HEAD + b"Transfer-Encoding: " + coding + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    status, headers, body = await exchange(request_)
    assert (status, headers["content-type"]) == (400, "application/json")
    assert json.loads(body)["error"]["code"] == "invalid_request"


@pytest.mark.anyio
@pytest.mark.parametrize("coding", [b"chunked", b"Chunked"])
async def test_plain_chunked_is_served(coding: bytes) -> None:
    request_ = HEAD + b"Transfer-Encoding: " + coding + b"\r\nConnection: close\r\n\r\n" \
        b"2\r\n{}\r\n0\r\n\r\n"
    status, _, body = await exchange(request_)
    assert (status, body) == (200, b"echo:{}")


# -- a head whose meaning would be a guess ------------------------------------------------------
BODY = b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"


@pytest.mark.anyio
@pytest.mark.parametrize("request_", [
    b"POST /v1/batchstring HTTP/1.1\r\n" + BODY,
    b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    HEAD + b"Host: u\r\n" + BODY,
], ids=["no-host-hot-route", "no-host-other-path", "two-hosts"])
async def test_an_http11_request_without_exactly_one_host_is_a_json_400(request_: bytes
                                                                        ) -> None:
    status, headers, body = await exchange(request_)
    assert (status, headers["content-type"]) == (400, "application/json")
    assert json.loads(body)["error"]["code"] == "invalid_host"


@pytest.mark.anyio
async def test_an_http10_request_needs_no_host() -> None:
    status, _, body = await exchange(b"POST /v1/batchstring HTTP/1.0\r\n" + BODY)
    assert (status, body) == (200, b"echo:{}")


@pytest.mark.anyio
@pytest.mark.parametrize("header", [b"Authorization: Bearer a", b"Idempotency-Key: k",
                                    b"X-Request-Timeout-Ms: 50"])
async def test_a_header_the_server_reads_sent_twice_is_a_json_400(header: bytes) -> None:
    status, headers, body = await exchange(HEAD + header + b"\r\n" + header + b"x\r\n" + BODY)
    assert (status, headers["content-type"]) == (400, "application/json")
    assert json.loads(body)["error"]["code"] == "repeated_header"


@pytest.mark.anyio
async def test_other_headers_may_repeat() -> None:
    status, _, body = await exchange(HEAD + b"Accept: a\r\nAccept: b\r\n" + BODY)
    assert (status, body) == (200, b"echo:{}")


# -- X-Request-Timeout-Ms -----------------------------------------------------------------------
@pytest.mark.parametrize("header", ["5_0", "inf", "1e3", " 50 ", "50\n", "+50", "1.2.3", ".",
                                    "\u0665\u0660", "0x32", ""])
def test_a_timeout_is_digits_with_at_most_one_dot(header: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_timeout(header, 10.0, 60.0)
    assert refused.value.code == "invalid_timeout"


@pytest.mark.parametrize(("header", "seconds"), [("50", 0.05), ("2.5", 0.0025), ("50.", 0.05),
                                                 ("1000000000000", 60.0)])
def test_a_timeout_of_digits_and_one_dot_is_read(header: str, seconds: float) -> None:
    assert parse_timeout(header, 10.0, 60.0) == seconds


# -- Idempotency-Key ----------------------------------------------------------------------------
def routes() -> Routes:
    return Routes(None, Settings(model="sim"), KEYS, Metrics())  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["a b", "a\xe9", "a\tb", "a\x7f", "\u20ac"])
def test_an_idempotency_key_outside_visible_ascii_is_refused(key: str) -> None:
    with pytest.raises(ApiError) as refused:
        routes().check_head(PAID, {"idempotency-key": key})
    assert refused.value.code == "invalid_idempotency_key"


def test_every_visible_ascii_character_may_make_a_key() -> None:
    key = "".join(map(chr, range(0x21, 0x7F)))
    assert routes().check_head(PAID, {"idempotency-key": key}) == key
