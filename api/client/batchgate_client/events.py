"""What a stream's event means: an input's output, an input's error (typed, as the exception
its code names, a guard's refusal with its verdict), or the done event that ends the stream.
Held to the contract one event at a time; the stream as a whole is held in `resume`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from batchgate_client.errors import BY_CODE, BatchgateError, ProtocolError, Refusal, Refused


@dataclass(frozen=True, slots=True)
class Output:
    """An input's output; `index` is the input's place in the call's inputs."""

    index: int
    output: str


@dataclass(frozen=True, slots=True)
class Failure:
    """An input that has no output, and why: `error` is the exception its code names
    (`DeadlineExceeded`, `ModelError`, `GuardUnavailable`, `Refused`, ...), given, not
    raised: the stream goes on with the other inputs."""

    index: int
    error: BatchgateError

    @property
    def refusal(self) -> Refusal | None:
        """The guard's verdict when a guard refused the input (`error` is then `Refused`,
        whose `refused` names this input alone), else None."""
        return self.error.refused.get(self.index) if isinstance(self.error, Refused) else None


@dataclass(frozen=True, slots=True)
class Done:
    """The stream's last event: the answer's id, the version that ran it ("topics@v1";
    None if the server did not say), and its counts over the whole stream, resumes
    included (they are checked against what came before the client gives them)."""

    id: str
    model: str | None
    outputs: int
    errors: int


Result = Output | Failure


def event_from(data: str, count: int) -> Output | Failure | Done:
    """The event one frame's data holds, in a stream of `count` inputs. Raises
    ProtocolError unless it is JSON of one of the three shapes, its index one of the
    `count` inputs', its error a code and a message (a refusal's also a guard and a reason)."""
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise _broken("an event is not JSON") from exc
    if not isinstance(event, dict):
        raise _broken("an event is not an object")
    if event.get("done") is True:
        return _done(event)
    index = event.get("index")
    if type(index) is not int or not 0 <= index < count:
        raise _broken(f"an event's index is not one of the {count} inputs'")
    if "output" in event:
        if not isinstance(event["output"], str):
            raise _broken(f"input {index}'s output is not a string")
        return Output(index, event["output"])
    error = event.get("error")
    if not isinstance(error, dict):
        raise _broken(f"input {index}'s event holds neither an output nor an error")
    return Failure(index, _error(index, error))


def _error(index: int, error: dict[str, Any]) -> BatchgateError:
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        raise _broken(f"input {index}'s error is not a code and a message")
    kind = BY_CODE.get(code, BatchgateError)
    if kind is not Refused:
        return kind(message, code)
    guard, reason = error.get("guard"), error.get("reason")
    if not isinstance(guard, str) or not isinstance(reason, str):
        raise _broken(f"input {index}'s refusal names no guard and reason")
    return Refused(message, code, refused={index: Refusal(guard, reason)})


def _done(event: dict[str, Any]) -> Done:
    answer, model, counts = event.get("id"), event.get("model"), event.get("counts")
    outputs = counts.get("outputs") if isinstance(counts, dict) else None
    errors = counts.get("errors") if isinstance(counts, dict) else None
    if not isinstance(answer, str) or (model is not None and not isinstance(model, str)) \
            or type(outputs) is not int or type(errors) is not int:
        raise _broken("the done event is not {done, id, model, counts: {outputs, errors}}")
    return Done(answer, model or None, outputs, errors)


def _broken(what: str) -> ProtocolError:
    return ProtocolError(f"the stream breaks the protocol: {what}", status=200)


__all__ = ["Done", "Failure", "Output", "Result", "event_from"]
