"""W3C traceparent, read and written; what the core records of a traced request's attempts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher.tracing import (
    ANSWERED,
    BATCH,
    HEDGE,
    RERAN,
    RERUN,
    TWIN_ANSWERED,
    RequestTrace,
    TraceParent,
    format_traceparent,
    parse_traceparent,
    request_context,
)

HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PARENT = TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)


def test_a_w3c_example_header_parses_to_its_ids() -> None:
    assert parse_traceparent(HEADER) == PARENT
    assert str(PARENT) == HEADER


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255))
def test_any_context_round_trips(trace_id: int, span_id: int, flags: int) -> None:
    text = format_traceparent(trace_id, span_id, flags)
    assert len(text) == 55
    assert parse_traceparent(text) == TraceParent(trace_id, span_id, flags)


@pytest.mark.parametrize("junk", [
    None, "", "00", HEADER[:-1], HEADER + "0", HEADER.upper(), HEADER.replace("-", "_"),
    "ff" + HEADER[2:],  # the forbidden version
    "00-" + "0" * 32 + HEADER[35:],  # an all-zero trace id
    HEADER[:36] + "0" * 16 + "-01",  # an all-zero span id
    HEADER.replace("4bf9", "4bg9"), "00-xyz", "\x00" * 60,
])
def test_junk_is_no_context(junk: str | None) -> None:
    assert parse_traceparent(junk) is None


@given(st.text(max_size=80))
def test_no_text_makes_the_parser_raise(text: str) -> None:
    parsed = parse_traceparent(text)
    assert parsed is None or (parsed.trace_id > 0 and parsed.span_id > 0)


def test_a_later_version_may_carry_more_after_a_dash() -> None:
    assert parse_traceparent("01" + HEADER[2:] + "-what-comes-next") == PARENT
    assert parse_traceparent("01" + HEADER[2:] + "x") is None


def test_a_request_span_joins_the_callers_trace_or_starts_one() -> None:
    parent, own = request_context(HEADER)
    assert parent == PARENT
    assert own.trace_id == PARENT.trace_id and own.span_id != PARENT.span_id
    parent, own = request_context("garbage")
    assert parent is None and own.trace_id != 0 and own.span_id != 0 and own.flags == 1


def trace() -> RequestTrace:
    return RequestTrace(PARENT, received=1.0, admitted=1.001)


def test_a_death_then_a_rerun_closes_the_first_attempt_as_rerun() -> None:
    t = trace()
    first = t.sent(7, 1, 1.01, BATCH, 3)
    assert first is not None and first.open
    t.died(1, 7, 1.05)
    second = t.sent(8, 2, 1.05, RERUN, 3)
    assert second is not None and second.span_id != first.span_id
    assert (first.end, first.outcome) == (1.05, RERAN) and second.open
    t.landed(2, 8)
    t.settled(1.2, ANSWERED)
    assert [(a.worker, a.kind, a.outcome) for a in t.in_order()] == [
        (1, BATCH, RERAN), (2, RERUN, ANSWERED)]


def test_a_hedge_leaves_its_twin_open_and_the_first_answer_wins() -> None:
    t = trace()
    t.sent(7, 1, 1.0, BATCH, 1)
    t.sent(9, 2, 1.5, HEDGE, 1)
    assert all(a.open for a in t.attempts.values())
    t.landed(2, 9)  # the table tells only the batch whose answer settled inputs
    t.settled(1.6, ANSWERED)
    assert {a.batch_id: a.outcome for a in t.attempts.values()} == {
        7: TWIN_ANSWERED, 9: ANSWERED}


def test_each_batch_that_answered_inputs_of_a_request_is_answered() -> None:
    t = trace()
    t.sent(1, 1, 1.0, BATCH, 50)  # a request of 100 inputs in two batches
    t.sent(2, 2, 1.0, BATCH, 50)
    t.landed(1, 1)
    t.landed(2, 2)
    t.settled(1.2, ANSWERED)
    assert [a.outcome for a in t.in_order()] == [ANSWERED, ANSWERED]


def test_settling_closes_every_open_attempt_with_its_outcome() -> None:
    t = trace()
    t.sent(1, 1, 1.0, BATCH, 2)
    t.sent(2, 2, 1.0, BATCH, 2)
    t.settled(3.0, "deadline_exceeded")
    assert [(a.end, a.outcome) for a in t.in_order()] == [(3.0, "deadline_exceeded")] * 2


def test_one_batch_is_one_attempt_however_many_inputs_of_the_request_ride_in_it() -> None:
    t = trace()
    assert t.sent(4, 1, 1.0, BATCH, 5) is not None
    assert t.sent(4, 1, 1.0, BATCH, 5) is None
    assert len(t.attempts) == 1 and math.isnan(trace().first_sent())


def test_an_attempts_traceparent_names_its_own_span_in_the_requests_trace() -> None:
    t = trace()
    attempt = t.sent(4, 1, 1.0, BATCH, 1)
    assert attempt is not None
    assert parse_traceparent(t.traceparent(attempt)) == TraceParent(
        PARENT.trace_id, attempt.span_id, PARENT.flags)
