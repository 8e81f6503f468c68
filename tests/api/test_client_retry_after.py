"""Retry-After as RFC 9110 (10.2.3) has it: delay-seconds or an HTTP-date (against the
answer's own Date), read leniently (decimals), never a wait below the policy's floor, and
never a wait past the call's deadline."""

from __future__ import annotations

import email.utils
from dataclasses import dataclass, field

import httpx
import pytest

import batchgate_client as c
from tests.api.client_fakes import FakeClock, echo, make, refuse

DATE = "Sun, 06 Nov 1994 08:49:37 GMT"
SENT = email.utils.parsedate_to_datetime(DATE).timestamp()


@pytest.mark.parametrize(("value", "seconds"), [
    ("3", 3.0), (" 3 ", 3.0), ("0", 0.0), ("1.5", 1.5), ("120", 120.0),
    ("Sun, 06 Nov 1994 08:49:44 GMT", 7.0),  # IMF-fixdate
    ("Sunday, 06-Nov-94 08:49:44 GMT", 7.0),  # RFC 850, obsolete but to be read
    ("Sun Nov  6 08:49:44 1994", 7.0),  # asctime
    ("Sun, 06 Nov 1994 08:49:00 GMT", 0.0),  # already past
])
def test_delay_seconds_and_http_dates_are_read(value: str, seconds: float) -> None:
    assert c.parse_retry_after(value, DATE) == seconds


@pytest.mark.parametrize("value", [None, "", "soon", "-1", "1e3", "nan", "inf", "1,5",
                                   "Sun, 99 Nov 1994 08:49:44 GMT"])
def test_an_unreadable_retry_after_is_none(value: str | None) -> None:
    assert c.parse_retry_after(value, DATE) is None


def test_a_date_without_the_answers_date_is_taken_against_this_hosts_clock() -> None:
    assert c.parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now=lambda: SENT) == 10.0
    assert c.parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", "garbage",
                               now=lambda: SENT) == 10.0


def test_an_error_answer_carries_its_retry_after_as_a_date() -> None:
    response = refuse(503, "over_budget", "Sun, 06 Nov 1994 08:49:39 GMT",
                      headers={"Date": DATE})
    assert c.error_from(response).retry_after == 2.0


@dataclass
class Refusing:
    """A server that refuses `refusals` times with this Retry-After, then answers; it keeps
    the fake clock's time at each attempt."""

    retry_after: str
    refusals: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    clock: FakeClock = field(default_factory=FakeClock)
    attempts: list[float] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.attempts.append(self.clock.now)
        if len(self.attempts) <= self.refusals:
            return refuse(503, "over_budget", self.retry_after, self.headers)
        return echo(request)


def waits(server: Refusing, retry: c.RetryPolicy | None = None) -> list[float]:
    assert make(server, server.clock, retry=retry).batchstring(["ab"]) == ["ba"]
    return server.clock.slept


def test_retry_after_0_still_waits_the_floor_before_each_attempt() -> None:
    slept = waits(Refusing("0", refusals=4))
    assert len(slept) == 4 and all(0.1 <= s <= 0.125 for s in slept)


def test_the_floor_is_the_policys_to_set() -> None:
    slept = waits(Refusing("0", refusals=2), c.RetryPolicy(retry_after_floor=0.5))
    assert len(slept) == 2 and all(0.5 <= s <= 0.625 for s in slept)


def test_a_retry_after_in_decimals_is_honoured() -> None:
    [slept] = waits(Refusing("1.5"))
    assert 1.5 <= slept <= 1.875


def test_an_http_date_is_honoured_against_the_answers_own_date() -> None:
    [slept] = waits(Refusing("Sun, 06 Nov 1994 08:49:40 GMT", headers={"Date": DATE}))
    assert 3.0 <= slept <= 3.75


def test_an_unreadable_retry_after_backs_off_as_after_no_answer() -> None:
    [slept] = waits(Refusing("soon"))
    assert 0 <= slept <= 0.05


def test_a_date_past_the_deadline_raises_at_once() -> None:
    server = Refusing("Sun, 06 Nov 1994 08:50:37 GMT", headers={"Date": DATE})
    with pytest.raises(c.Overloaded) as caught:
        make(server, server.clock, timeout=30).batchstring(["a"])
    assert caught.value.retry_after == 60.0
    assert server.clock.slept == [] and server.attempts == [0.0]


def test_no_attempt_starts_after_the_deadline() -> None:
    server = Refusing("1", refusals=100)
    client = make(server, server.clock, timeout=2.5, retry=c.RetryPolicy(max_attempts=100))
    with pytest.raises(c.Overloaded):
        client.batchstring(["a"])
    assert len(server.attempts) == 3 and all(t < 2.5 for t in server.attempts)
