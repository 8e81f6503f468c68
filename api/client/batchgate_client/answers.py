"""What an answer means: a 200's outputs, held to the contract, the version that ran them
and the inputs a guard refused; the typed error of any other status; and Retry-After, read
as RFC 9110 says. Nothing the server sends is trusted."""

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
    Refusal,
    Refused,
    ServerError,
)

DELAY = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # delay-seconds, and the decimals some servers send
UNREADABLE = (ValueError, KeyError, TypeError, IndexError, RecursionError)


class Outputs(list[str | None]):
    """A call's outputs, in order (a list), and the versions that ran them. An output is
    None only where a guard refused its input: `refused` maps that input's index in the
    call to the guard's verdict (a call whose every input is refused raises `Refused`)."""

    __slots__ = ("models", "refused")

    def __init__(self, outputs: Iterable[str | None] = (),
                 models: tuple[str | None, ...] = (),
                 refused: dict[int, Refusal] | None = None) -> None:
        super().__init__(outputs)
        self.models = models  # each request's version, in order; None: the server said none
        self.refused = refused if refused is not None else {}

    @property
    def model(self) -> str | None:
        """The version that ran them all ("topics@v2"). None when the server did not say
        (an older server), or when the requests of a split call ran on different versions
        (under weights each request is placed apart): `models` has each one's."""
        first = self.models[0] if self.models else None
        return first if all(m == first for m in self.models) else None

    @classmethod
    def joined(cls, parts: Sequence[Outputs]) -> Outputs:
        """The outputs of a split call's requests, collated in order (each refusal under
        its input's index in the call)."""
        refused: dict[int, Refusal] = {}
        offset = 0
        for part in parts:
            refused.update((offset + index, refusal) for index, refusal in part.refused.items())
            offset += len(part)
        return cls([out for part in parts for out in part],
                   tuple(model for part in parts for model in part.models), refused)

    def whole(self) -> Outputs:
        """These outputs, unless a guard refused every input: then `Refused`, raised."""
        if self and len(self.refused) == len(self):
            raise Refused("a guard refused every input", "refused", 422,
                          refused=dict(sorted(self.refused.items())))
        return self


def outputs_from(response: httpx.Response, count: int) -> Outputs:
    """The outputs of a 200 answer to `count` inputs, its version and the inputs a guard
    refused. Raises ProtocolError unless its body is `{"outputs": [...]}` holding exactly
    `count` outputs (one output per input is the contract, and a client that collates
    chunks cannot tell whose output is missing), each a string, or null where its
    `refused` names the input; with a string `model` if any."""
    try:
        body = response.json()
    except UNREADABLE as exc:
        raise _broken(response, "the body is not JSON") from exc
    outputs = body.get("outputs") if isinstance(body, dict) else None
    if not isinstance(outputs, list):
        raise _broken(response, "the body holds no list of outputs")
    if len(outputs) != count:
        raise _broken(response, f"{len(outputs)} outputs for {count} inputs")
    refused = refusals_from(response, body["refused"], count) if "refused" in body else {}
    for index, output in enumerate(outputs):
        if not isinstance(output, str) and (output is not None or index not in refused):
            raise _broken(response, "an output is not a string")
        if output is not None and index in refused:
            raise _broken(response, f"input {index} is refused and has an output")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _broken(response, "the model is not a string")
    return Outputs(outputs, (model or None,), refused)


def refusals_from(response: httpx.Response, listed: object, count: int
                  ) -> dict[int, Refusal]:
    """The verdicts a `refused` list holds, by input index; raises ProtocolError unless
    it is a list of `{"index", "guard", "reason"}`, each index one of the `count` inputs'
    and named once."""
    if not isinstance(listed, list):
        raise _broken(response, "refused is not a list")
    refused: dict[int, Refusal] = {}
    for entry in listed:
        index = entry.get("index") if isinstance(entry, dict) else None
        guard = entry.get("guard") if isinstance(entry, dict) else None
        reason = entry.get("reason") if isinstance(entry, dict) else None
        if type(index) is not int or not 0 <= index < count or index in refused \
                or not isinstance(guard, str) or not isinstance(reason, str):
            raise _broken(response, f"a refusal is not one of the {count} inputs' "
                                    "{index, guard, reason}")
        refused[index] = Refusal(guard, reason)
    return refused


def error_from(response: httpx.Response, count: int | None = None) -> BatchgateError:
    """The typed exception for an answer other than a 200, whatever its body (a proxy's
    page, say): by its code when it is ours, else by its status. `count`: the inputs of
    the request, which a `Refused` must name each of."""
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
    if kind is Refused and status == 422:
        return _refused(response, message, retry_after, count)
    return kind(message, code, status, retry_after)


def _refused(response: httpx.Response, message: str, retry_after: float | None,
             count: int | None) -> BatchgateError:
    """A 422 `refused`: each input's verdict, by its index; with `count`, its list must
    name each of the request's `count` inputs once (else ProtocolError)."""
    try:
        refused = refusals_from(response, response.json()["error"].get("refused", []),
                                count if count is not None else 1 << 62)
    except ProtocolError as exc:
        return exc
    if count is not None and len(refused) != count:
        return _broken(response, f"refused names {len(refused)} of {count} inputs")
    return Refused(message, "refused", response.status_code, retry_after, refused)


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


__all__ = ["Outputs", "error_from", "outputs_from", "parse_retry_after", "refusals_from"]
