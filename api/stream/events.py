"""A streamed request's events, written once for both framings (`api.http.Framing`): one
per input as soon as the part that carries it is answered, then the last, `done`.

    {"index": i, "output": "..."}                       its output
    {"index": i, "error": {"code", "message"}}          its error (a guard's refusal too:
                                                        code "refused", with "guard", "reason")
    {"done": true, "id", "model", "counts": {"outputs", "errors"}}

A part's answer (`api.http.Outcome`) is what any request of its inputs would get: outputs
with a guard's refusals beside them, or one error for all of them; a keyed part's comes as
the rendered body its key keeps, and is read back here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from api.errors import to_api_error
from api.http import GUARD_SKIPPED, Answered, Outcome

POSITION_HEADER = "stream-position"  # `api.door.positions.STREAM_POSITION`, as it is read


class PartEvents(NamedTuple):
    """What a part's answer says of its inputs."""

    events: list[bytes]  # one JSON object per input, in input order
    errors: int  # how many of them are errors
    model: str  # the version that ran it ("" when nothing did)
    position: int | None  # its place in a keyed stream, as the door numbered it


def part_events(outcome: Outcome, first: int, count: int) -> PartEvents:
    """The events of a part of `count` inputs, the first of them input `first`."""
    if isinstance(outcome, Answered):
        return _ran(outcome.outputs, outcome.refused, outcome.skipped, first, outcome.model,
                    None)
    position = None
    skipped: tuple[str, ...] = ()
    for name, value in outcome.headers:
        lowered = name.lower()
        if lowered == POSITION_HEADER:
            position = int(value)
        elif lowered == GUARD_SKIPPED.lower():
            skipped = tuple(g.strip() for g in value.split(","))
    body: dict[str, Any] = orjson.loads(outcome.body)
    if outcome.status == 200:
        refused = tuple((r["index"], r["guard"], r["reason"]) for r in body.get("refused", ()))
        return _ran(body["outputs"], refused, skipped, first, body.get("model", ""), position)
    error = body.get("error", {})
    if error.get("code") == "refused" and "refused" in error:  # every input refused
        refused = tuple((r["index"], r["guard"], r["reason"]) for r in error["refused"])
        return _ran([None] * count, refused, skipped, first, "", position)
    return failed(error.get("code", "internal"), error.get("message", ""), first, count,
                  position)


def failed(code: str, message: str, first: int, count: int,
           position: int | None = None) -> PartEvents:
    """Every input of a part answered with one error."""
    error = {"code": code, "message": message}
    return PartEvents([orjson.dumps({"index": first + i, "error": error})
                       for i in range(count)], count, "", position)


def failed_by(exc: BaseException, first: int, count: int) -> PartEvents:
    """Every input of a part answered with `exc`, as its client would see it."""
    err = to_api_error(exc)
    return failed(err.code, err.message, first, count)


def done_event(answer_id: str, model: str, outputs: int, errors: int) -> bytes:
    return orjson.dumps({"done": True, "id": answer_id, "model": model,
                         "counts": {"outputs": outputs, "errors": errors}})


def _ran(outputs: list[str | None], refused: tuple[tuple[int, str, str], ...],
         skipped: tuple[str, ...], first: int, model: str, position: int | None
         ) -> PartEvents:
    verdicts = {index: (guard, reason) for index, guard, reason in refused}
    events: list[bytes] = []
    for i, output in enumerate(outputs):
        verdict = verdicts.get(i)
        if verdict is not None:
            guard, reason = verdict
            events.append(orjson.dumps({"index": first + i, "error": {
                "code": "refused", "message": f"refused by the guard {guard}: {reason}",
                "guard": guard, "reason": reason}}))
        elif skipped:
            events.append(orjson.dumps({"index": first + i, "output": output,
                                        "guard_skipped": list(skipped)}))
        else:
            events.append(orjson.dumps({"index": first + i, "output": output}))
    return PartEvents(events, len(verdicts), model, position)


__all__ = ["POSITION_HEADER", "PartEvents", "done_event", "failed", "failed_by", "part_events"]
