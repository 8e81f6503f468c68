"""What an answer means: a 200's outputs, held to the contract, and the version that ran
them; the typed error of any other status; and Retry-After, read as RFC 9110 says. Nothing
the server sends is trusted."""

from __future__ import annotations

import datetime
import email.utils
import re
import time
from collections.abc import Callable, Iterable, Sequence

import httpx

from batchgate_client.errors import (
    BY_CODE,
    BY_STATUS,
    BadRequest,
    BatchgateError,
    ProtocolError,
    ServerError,
)

DELAY = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # delay-seconds, and the decimals some servers send
UNREADABLE = (ValueError, KeyError, TypeError, IndexError, RecursionError)


class Outputs(list[str]):
    """A call's outputs, in order (a list), and the versions that ran them."""

    __slots__ = ("models",)

    def __init__(self, outputs: Iterable[str] = (), models: tuple[str | None, ...] = ()
                 ) -> None:
        super().__init__(outputs)
        self.models = models  # each request's version, in order; None: the server said none

    @property
    def model(self) -> str | None:
        """The version that ran them all ("topics@v2"). None when the server did not say
        (an older server), or when the requests of a split call ran on different versions
        (under weights each request is placed apart): `models` has each one's."""
        first = self.models[0] if self.models else None
        return first if all(m == first for m in self.models) else None

    @classmethod
    def joined(cls, parts: Sequence[Outputs]) -> Outputs:
        """The outputs of a split call's requests, collated in order."""
        return cls([out for part in parts for out in part],
                   tuple(model for part in parts for model in part.models))


def outputs_from(response: httpx.Response, count: int) -> Outputs:
    """The outputs of a 200 answer to `count` inputs, and its version. Raises ProtocolError
    unless its body is `{"outputs": [...]}` holding exactly `count` strings (one output per
    input is the contract, and a client that collates chunks cannot tell whose output is
    missing), with a string `model` if any."""
    try:
        body = response.json()
    except UNREADABLE as exc:
        raise _broken(response, "the body is not JSON") from exc
    outputs = body.get("outputs") if isinstance(body, dict) else None
    if not isinstance(outputs, list):
        raise _broken(response, "the body holds no list of outputs")
    if len(outputs) != count:
        raise _broken(response, f"{len(outputs)} outputs for {count} inputs")
    if not all(isinstance(output, str) for output in outputs):
        raise _broken(response, "an output is not a string")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _broken(response, "the model is not a string")
    return Outputs(outputs, (model or None,))


def error_from(response: httpx.Response) -> BatchgateError:
    """The typed exception for an answer other than a 200, whatever its body (a proxy's
    page, say): by its code when it is ours, else by its status."""
    status = response.status_code
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except UNREADABLE:
        code, message = "", response.text[:200] or response.reason_phrase
    retry_after = parse_retry_after(response.headers.get("retry-after"),
                                    response.headers.get("date"))
    if status < 400:
        return ProtocolError(f"HTTP {status}, which batchgate never answers: {message}",
                             code, status, retry_after)
    kind = BY_CODE.get(code) or BY_STATUS.get(status) or (
        ServerError if status >= 500 else BadRequest)
    return kind(message, code, status, retry_after)


def parse_retry_after(value: str | None, date: str | None = None,
                      now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait by a Retry-After header (RFC 9110, 10.2.3): delay-seconds, or an
    HTTP-date taken against the answer's own Date (so the two hosts' clocks need not agree;
    against `now`, wall-clock seconds, without one), never below 0. None when absent or
    unreadable: the caller then backs off as after no answer."""
    if value is None:
        return None
    value = value.strip()
    if DELAY.fullmatch(value):
        return float(value)
    when = _http_date(value)
    if when is None:
        return None
    sent = _http_date(date) if date is not None else None
    return max(0.0, when - (now() if sent is None else sent))


def _http_date(value: str) -> float | None:
    """Epoch seconds of an HTTP-date in any of its three forms (IMF-fixdate, and the
    obsolete RFC 850 and asctime that a recipient must still read); None if it is none."""
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime names no zone; an HTTP-date is always UTC
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _broken(response: httpx.Response, what: str) -> ProtocolError:
    status = response.status_code
    return ProtocolError(f"HTTP {status} answer breaks the protocol: {what}", status=status)


__all__ = ["Outputs", "error_from", "outputs_from", "parse_retry_after"]
