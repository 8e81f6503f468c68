"""Parsing and validating a `POST /v1/batchstring` body and its timeout header."""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from api.errors import ApiError
from batcher import NAME_PATTERN

MODEL_NAME = re.compile(rf"{NAME_PATTERN}(@{NAME_PATTERN})?")
"""`model` as a request names it: a model of the catalogue, or model@version. Which ones
are served is the core's to say (a gateway holds no catalogue)."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_inputs: int
    max_input_chars: int
    max_body_bytes: int


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    texts: list[str]
    single: bool  # {"input": s} rather than {"inputs": [...]}
    model: str | None = None  # as named; None: the catalogue's first model


def parse_body(body: bytes, limits: Limits) -> ParsedRequest:
    """Validate a request body; raise ApiError (400 malformed, 413 too large, 422 invalid)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError("malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "the body must be a JSON object")
    model = data.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise ApiError("invalid_request", "'model' must be a string")
        if MODEL_NAME.fullmatch(model) is None:
            raise ApiError("unknown_model", "'model' names a model, or model@version, of "
                                            "letters, digits, '_', '.' and '-'")
    if ("input" in data) == ("inputs" in data):
        raise ApiError("invalid_request", "give exactly one of 'input' or 'inputs'")
    if "input" in data:
        text = data["input"]
        if not isinstance(text, str):
            raise ApiError("invalid_request", "'input' must be a string")
        _check_length(text, limits)
        return ParsedRequest([text], True, model)
    texts = data["inputs"]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ApiError("invalid_request", "'inputs' must be a list of strings")
    if not texts:
        raise ApiError("empty_inputs", "'inputs' must hold at least one string")
    if len(texts) > limits.max_inputs:
        raise ApiError("too_many_inputs", f"'inputs' holds at most {limits.max_inputs} strings"
        )
    for text in texts:
        _check_length(text, limits)
    return ParsedRequest(texts, False, model)


def _check_length(text: str, limits: Limits) -> None:
    if len(text) > limits.max_input_chars:
        raise ApiError("input_too_large", f"each input holds at most {limits.max_input_chars} chars"
        )


MIN_TIMEOUT_MS = 1
# ASCII digits and at most one dot: float() also takes "5_0", "inf", "1e3" and " 50 ".
TIMEOUT_MS = re.compile(r"[0-9]+\.?[0-9]*|\.[0-9]+")


def parse_timeout(header: str | None, default: float, maximum: float) -> float:
    """Seconds from X-Request-Timeout-Ms, defaulted and capped; 400 if unreadable."""
    if header is None:
        return default
    if TIMEOUT_MS.fullmatch(header) is None:
        raise ApiError("invalid_timeout",
                       "X-Request-Timeout-Ms must be a number of milliseconds: digits and "
                       "at most one dot")
    ms = float(header)
    if not ms >= MIN_TIMEOUT_MS:  # a deadline of 0.0001 ms could only time out
        raise ApiError("invalid_timeout",
                       f"X-Request-Timeout-Ms must be at least {MIN_TIMEOUT_MS}")
    return min(ms / 1000, maximum)


__all__ = ["MIN_TIMEOUT_MS", "MODEL_NAME", "Limits", "ParsedRequest", "parse_body", "parse_timeout"]
