"""One inference of the Open Inference Protocol through the same door as `/v1/batchstring`:
its HTTP side (`/v2/models/{name}/infer`) and its gRPC side (`ModelInfer`) decode their
tensors into strings and call `infer`; everything after that is the door's.

The key identifies the caller (`authorization`: the header, or the gRPC metadata of that
name), the deadline is the protocol's `timeout` parameter or `X-Request-Timeout-Ms`, an
`Idempotency-Key` keeps the answer, the model is the path's (`name`, `name@version`). What
the door refuses is raised as `ApiError`, whose code decides the status on either side
(`api.errors`); a protocol's own shape of error is its side's to write.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from api.config import Principal
from api.errors import ApiError, to_api_error
from api.http import (
    IDEMPOTENCY_KEY,
    MAX_IDEMPOTENCY_KEY,
    MODEL_NAME,
    Answered,
    ClientWatch,
    Job,
    Outcome,
    Routes,
    all_refused,
    answer_id,
    parse_timeout,
    trace_job,
)

SINGLE_MODEL = "default"
"""The name a server started with `--model SPEC` answers to (its catalogue's one model)."""


@dataclass(frozen=True, slots=True)
class Inferred:
    """An answer the door ran (or kept): one output per input, in order."""

    id: str
    outputs: list[str]  # "" where a guard refused the input
    refused: list[str]  # "guard:reason" per input ("" where allowed); [] when none was
    model: str  # the model's name
    version: str  # the version that ran it ("" for a kept answer that did not say)
    skipped: tuple[str, ...] = ()  # guards that failed open for some input


async def infer(routes: Routes, headers: Mapping[str, str], texts: list[str],
                model: str, version: str | None, timeout_ms: str | None, body: bytes,
                client: ClientWatch, span: str = "ModelInfer") -> Inferred:
    """Run `texts` on `model` (at `version`, if named) for the caller `headers` name
    (lower-case names: authorization, idempotency-key, x-request-timeout-ms, traceparent).
    `timeout_ms`: the protocol's own `timeout` parameter, which wins over the header;
    `body`: the request as sent, whose digest keys an Idempotency-Key; `span`: the request
    span's name where tracing is on. Raises ApiError."""
    started, tier, status = time.perf_counter(), "unknown", 200
    waits: tuple[float, ...] = ()
    ran = ""  # the version that ran it, for the metrics
    job: Job | None = None
    try:
        principal = routes.keys.identify(headers.get("authorization"))
        tier = principal.tier.label
        job = job_of(routes, principal, headers, texts, model, version, timeout_ms, body)
        outcome = await routes.core.run(job, client)
        waits, ran = outcome.waits, outcome.model
        return inferred(outcome, model, len(texts))
    except Exception as exc:
        err = to_api_error(exc)
        status = err.status
        raise err from None
    finally:
        elapsed = time.perf_counter() - started
        routes.record_later(tier, status, elapsed, waits, ran if waits else model)
        if job is not None and job.trace is not None:
            routes.traced(job, headers, status, elapsed, ran, name=span)


def model_key(model: str, version: str | None) -> str:
    """The door's name for a model and version of the path: "topics", "topics@v2"; 404
    `unknown_model` for a name no catalogue could hold."""
    key = model if version is None else f"{model}@{version}"
    if MODEL_NAME.fullmatch(key) is None:
        raise ApiError("unknown_model", f"no model named {key!r}")
    return key


def inferred(outcome: Outcome, model: str, n: int) -> Inferred:
    """The answer to `n` inputs on `model` that the door's `outcome` says; raises the
    ApiError of a refusal (a guard's of every input included)."""
    if isinstance(outcome, Answered):
        return _answered(outcome, model)
    if outcome.status != 200:  # a refusal the door rendered, or a kept error
        raise _refusal(outcome.status, outcome.body, dict(outcome.headers))
    return _kept(outcome.body, n, model, outcome.model)


def job_of(routes: Routes, principal: Principal, headers: Mapping[str, str], texts: list[str],
           model: str, version: str | None, timeout_ms: str | None, body: bytes) -> Job:
    """The door's job for an infer of `principal` (raises ApiError): the same checks and
    limits as `/v1`'s, a deadline from the protocol's `timeout` or the header, an
    Idempotency-Key's digest of the body (apart from `/v1`'s), the request span's
    traceparent."""
    limits = routes.limits
    if not 1 <= len(texts) <= limits.max_inputs:
        raise ApiError("too_many_inputs" if texts else "empty_inputs",
                       f"the input tensor holds 1..{limits.max_inputs} strings")
    for text in texts:
        if len(text) > limits.max_input_chars:
            raise ApiError("input_too_large",
                           f"each input holds at most {limits.max_input_chars} chars")
    key = headers.get("idempotency-key")
    if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
        raise ApiError("invalid_idempotency_key", f"Idempotency-Key must be "
                       f"1..{MAX_IDEMPOTENCY_KEY} visible ASCII characters")
    if key is not None and principal.key is None:
        raise ApiError("idempotency_needs_key",
                       "Idempotency-Key needs an API key: answers are kept per account")
    timeout = parse_timeout(
        timeout_ms if timeout_ms is not None else headers.get("x-request-timeout-ms"),
        routes.keys.tiers[principal.tier].timeout_ms / 1000,
        routes.settings.max_request_timeout_ms / 1000)
    idempotency = None if key is None else (key, hashlib.sha256(b"v2\0" + body).digest())
    name = model_key(model, version)
    return Job(principal, texts, False, timeout, idempotency,
               None if name == SINGLE_MODEL else name, trace_job(routes, headers))


def _answered(outcome: Answered, model: str) -> Inferred:
    if all_refused(outcome.outputs, outcome.refused):
        guard, reason = outcome.refused[0][1:]
        raise ApiError("refused", f"refused by the guard {guard}: {reason}"
                       if len(outcome.refused) == 1 else "every input was refused by a guard")
    refused = [""] * len(outcome.outputs)
    for index, guard, reason in outcome.refused:
        refused[index] = f"{guard}:{reason}"
    return Inferred(answer_id(), [o or "" for o in outcome.outputs],
                    refused if outcome.refused else [], model,
                    outcome.model.partition("@")[2], outcome.skipped)


def _kept(body: bytes, n: int, model: str, ran: str) -> Inferred:
    """A kept answer (an Idempotency-Key's replay, or its own run rendered by the door), in
    `/v1`'s JSON: read back into outputs."""
    data = orjson.loads(body)
    outputs = data["outputs"] if "outputs" in data else [data["output"]]
    refused = [""] * n
    for entry in data.get("refused", ()):
        refused[entry["index"]] = f"{entry['guard']}:{entry['reason']}"
    version = (ran or data.get("model") or "").partition("@")[2]
    return Inferred(data.get("id") or answer_id(), [o or "" for o in outputs],
                    refused if data.get("refused") else [], model, version)


def _refusal(status: int, body: bytes, headers: dict[str, str]) -> ApiError:
    """A refusal the door rendered, as the ApiError it was made from."""
    try:
        error = orjson.loads(body)["error"]
        return ApiError(error["code"], error["message"], headers or None)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ApiError("internal", f"the door answered {status}")


__all__ = ["SINGLE_MODEL", "Inferred", "infer", "inferred", "job_of", "model_key"]
