"""The stream's frames off the wire: SSE as the WHATWG standard parses it (data lines joined,
the id kept across events, comments skipped, any of its three line ends, even split across
chunks), NDJSON a line each, neither cut at a character JSON leaves unescaped."""

from __future__ import annotations

import pytest

import batchgate_client as c

SSE = (b": keep-alive\r\nid: 0\r\ndata: {\"index\": 1,\r\ndata:\"output\": \"x\"}\r\n\r\n"
       b"event: ignored\rdata: second\r\rid: 7\ndata\n\n")
SSE_FRAMES = [c.Frame('{"index": 1,\n"output": "x"}', "0"), c.Frame("second", "0"),
              c.Frame("", "7")]


def bytewise(decoder: c.SseDecoder | c.NdjsonDecoder, body: bytes) -> list[c.Frame]:
    return [frame for i in range(len(body)) for frame in decoder.feed(body[i:i + 1])]


def test_sse_events_hold_their_joined_data_lines_and_the_last_id() -> None:
    assert c.SseDecoder().feed(SSE) == SSE_FRAMES


def test_sse_read_a_byte_at_a_time_gives_the_same_events() -> None:
    assert bytewise(c.SseDecoder(), SSE) == SSE_FRAMES


def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    decoder = c.SseDecoder()
    assert decoder.feed(b"id: 3\ndata: a\r") == []
    assert decoder.feed(b"\ndata: b\r\n\r\n") == [c.Frame("a\nb", "3")]


def test_an_event_without_its_blank_line_is_not_given() -> None:
    assert c.SseDecoder().feed(b"id: 0\ndata: {}\n") == []


def test_ndjson_gives_a_frame_per_line_and_skips_blank_ones() -> None:
    body = '{"index": 0, "output": "a\u2028b\x85c"}\n\n{"done": true}\r\n{"partial'.encode()
    frames = [c.Frame('{"index": 0, "output": "a\u2028b\x85c"}'), c.Frame('{"done": true}\r')]
    assert c.NdjsonDecoder().feed(body) == frames
    assert bytewise(c.NdjsonDecoder(), body) == frames


def test_sse_data_keeps_unicode_line_separators() -> None:
    body = 'id: 0\ndata: "a\u2028b"\n\n'.encode()
    assert bytewise(c.SseDecoder(), body) == [c.Frame('"a\u2028b"', "0")]


@pytest.mark.parametrize("body", [
    b"x" * 65,  # one line
    b"data: " + b"x" * 40 + b"\ndata: " + b"y" * 40 + b"\n",  # one event of two lines
])
def test_a_line_or_event_past_the_bound_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(c.ProtocolError, match="longer than 64 bytes"):
        c.SseDecoder(limit=64).feed(body)


def test_a_line_that_is_not_utf8_is_a_protocol_error() -> None:
    with pytest.raises(c.ProtocolError, match="not UTF-8"):
        c.NdjsonDecoder().feed(b"\xff\xfe\n")
