"""A part's answer read as its inputs' events, whichever way it came (an answer the core
ran, a keyed part's kept body, a refusal), and the framings and resume points."""

from __future__ import annotations

import orjson
import pytest

from api.errors import ApiError, error_body
from api.http import Answered, Framing, Rendered, framing_of
from api.stream import done_event, part_events, resume_point


def decoded(events: list[bytes]) -> list[dict[str, object]]:
    return [orjson.loads(e) for e in events]


def test_an_answer_gives_each_input_its_output_or_its_guards_refusal() -> None:
    got = part_events(Answered(["A", None, "C"], (0.0,), 0.1, refused=((1, "safety", "marker"),),
                               model="m@v1"), 10, 3)
    assert decoded(got.events) == [
        {"index": 10, "output": "A"},
        {"index": 11, "error": {"code": "refused", "message": "refused by the guard safety: "
                                "marker", "guard": "safety", "reason": "marker"}},
        {"index": 12, "output": "C"}]
    assert (got.errors, got.model, got.position) == (1, "m@v1", None)


def test_a_kept_answer_is_read_back_with_its_place_and_the_guards_that_failed_open() -> None:
    body = orjson.dumps({"id": "x", "outputs": ["A", "B"], "model": "m@v2"})
    got = part_events(Rendered(200, body, (("Guard-Skipped", "safety"),
                                           ("Stream-Position", "75"))), 0, 2)
    assert decoded(got.events) == [{"index": 0, "output": "A", "guard_skipped": ["safety"]},
                                   {"index": 1, "output": "B", "guard_skipped": ["safety"]}]
    assert (got.errors, got.model, got.position) == (0, "m@v2", 75)


def test_every_input_refused_and_every_input_failed() -> None:
    refused = orjson.dumps({"error": {"code": "refused", "message": "m", "refused": [
        {"index": 0, "guard": "g", "reason": "r"}, {"index": 1, "guard": "g", "reason": "s"}]}})
    got = part_events(Rendered(422, refused), 4, 2)
    assert [e["error"]["reason"] for e in decoded(got.events)] == ["r", "s"]  # type: ignore[index]
    assert got.errors == 2
    failed = part_events(Rendered(504, error_body("deadline_exceeded", "late")), 4, 2)
    assert decoded(failed.events) == [
        {"index": i, "error": {"code": "deadline_exceeded", "message": "late"}} for i in (4, 5)]


def test_the_framings_and_the_last_event() -> None:
    event = done_event("abc", "m@v1", 3, 1)
    assert orjson.loads(event) == {"done": True, "id": "abc", "model": "m@v1",
                                   "counts": {"outputs": 3, "errors": 1}}
    assert Framing.SSE.frame(7, b"{}") == b"id: 7\ndata: {}\n\n"
    assert Framing.NDJSON.frame(7, b"{}") == b"{}\n"


@pytest.mark.parametrize(("accept", "framing"), [
    (None, None), ("application/json", None), ("*/*", None),
    ("text/event-stream", Framing.SSE), ("application/x-ndjson;q=0.9, */*", Framing.NDJSON),
    ("application/json, Text/Event-Stream", Framing.SSE),
    ("application/x-ndjson, text/event-stream", Framing.NDJSON),
    ("text/event-streamed", None)])
def test_a_stream_is_asked_for_by_name(accept: str | None, framing: Framing | None) -> None:
    assert framing_of(accept) is framing


def test_where_a_resumed_stream_starts() -> None:
    assert resume_point(Framing.SSE, None, b"after=4") == 0
    assert resume_point(Framing.SSE, "41", b"") == 42  # after the event it names
    assert resume_point(Framing.NDJSON, None, b"after=42") == 42  # the count it has
    assert resume_point(Framing.NDJSON, "41", b"") == 0
    for bad in ("-1", "x", "1" * 13):
        with pytest.raises(ApiError):
            resume_point(Framing.SSE, bad, b"")
        with pytest.raises(ApiError):
            resume_point(Framing.NDJSON, None, f"after={bad}".encode())
