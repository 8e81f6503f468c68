"""The `/v2` part of the OpenAPI document: the Open Inference Protocol's HTTP routes, by path
and method, as `api.oip.http` serves them. `api/http` builds the document and may not import
this room, so each route brings its operation along (`api.http.openapi.DocumentedRoute`).

Its errors are the protocol's shape, `{"error": message}` (with batchgate's `code` beside
it); the statuses of an infer are the ones `/v1/batchstring` answers, from `ERRORS`.
"""

from __future__ import annotations

from typing import Any

from api.errors import ERRORS
from api.http import ADMIN_ONLY, MAX_IDEMPOTENCY_KEY, MIN_TIMEOUT_MS
from api.oip.meta import INPUT, OUTPUT, REFUSED
from batcher import MAX_BATCH, NAME_PATTERN

JsonObject = dict[str, Any]
JSON = "application/json"
BINARY = "application/octet-stream"


def json_object(props: JsonObject, required: list[str] | None = None) -> JsonObject:
    return {"type": "object", "properties": props, **({"required": required} if required
                                                      else {})}


def string() -> JsonObject:
    return {"type": "string"}


NAME = {"type": "string", "pattern": f"^{NAME_PATTERN}$"}
OIP_ERROR = json_object({"error": string(), "code": {"type": "string", "enum": sorted(ERRORS)}},
                        ["error"])
TENSOR_META = json_object({"name": string(), "datatype": {"type": "string", "enum": ["BYTES"]},
                           "shape": {"type": "array", "items": {"type": "integer"}}},
                          ["name", "datatype", "shape"])
def _binary(what: str, rest: str) -> JsonObject:
    """A body in the binary tensor data extension: `what` is its JSON part, `rest` says the
    bytes after it."""
    return {"schema": {"type": "string", "format": "binary", "description": (
        "the binary tensor data extension: with the header Inference-Header-Content-Length: "
        f"L, the first L bytes are the JSON {what}, the rest {rest}, each string a 4-byte "
        "little-endian length and its UTF-8 bytes")}}


STRINGS = {"type": "array", "items": string(), "minItems": 1, "maxItems": MAX_BATCH}


def paths() -> dict[str, JsonObject]:
    """Each `/v2` path's operations, by method."""
    model = "/v2/models/{name}"
    version = model + "/versions/{version}"
    return {
        "/v2/health/live": {"get": _bare("the server is live", {})},
        "/v2/health/ready": {"get": _bare("some model can serve, and the server is not "
                                          "draining", {503: "not ready"})},
        "/v2": {"get": _json("server metadata: name, version, extensions", json_object(
            {"name": string(), "version": string(),
             "extensions": {"type": "array", "items": string()}},
            ["name", "version", "extensions"]), {})},
        model: {"get": _metadata([])},
        version: {"get": _metadata(["version"])},
        model + "/ready": {"get": _ready([])},
        version + "/ready": {"get": _ready(["version"])},
        model + "/infer": {"post": _infer([])},
        version + "/infer": {"post": _infer(["version"])},
    }


def _path_params(extra: list[str]) -> list[JsonObject]:
    return [{"name": name, "in": "path", "required": True, "schema": NAME,
             "description": "the model" if name == "name" else "a live version of it",
             "examples": {"one": {"value": "default" if name == "name" else "v1"}}}
            for name in ["name", *extra]]


def _errors(statuses: dict[int, str]) -> JsonObject:
    return {str(status): {"description": why, "content": {JSON: {"schema": OIP_ERROR}}}
            for status, why in statuses.items()}


def _bare(what: str, errors: dict[int, str]) -> JsonObject:
    """An answer told by its status alone."""
    return {"summary": what, "responses": {
        "200": {"description": what},
        **{str(s): {"description": why} for s, why in errors.items()}}}


def _json(what: str, schema: JsonObject, errors: dict[int, str]) -> JsonObject:
    return {"summary": what, "responses": {
        "200": {"description": what, "content": {JSON: {"schema": schema}}},
        **_errors({503: "the core cannot be asked", **errors})}}


def _metadata(extra: list[str]) -> JsonObject:
    out = _json("model metadata: its live versions, its one input and its output",
                json_object({"name": string(), "versions": {"type": "array", "items": string()},
                             "platform": string(), "inputs": {"type": "array",
                                                              "items": TENSOR_META},
                             "outputs": {"type": "array", "items": TENSOR_META}},
                            ["name", "versions", "platform", "inputs", "outputs"]),
                {404: "no such model (or version) is served"})
    out["parameters"] = _path_params(extra)
    return out


def _ready(extra: list[str]) -> JsonObject:
    out = _bare("the model (or version) is held by a worker: it answers without a load", {
        400: "not ready (`Model version not ready`, as Triton says)",
        404: "no such model (or version) is served", 503: "the core cannot be asked"})
    out["parameters"] = _path_params(extra)
    return out


def _infer(extra: list[str]) -> JsonObject:
    statuses = sorted({e.status for c, e in ERRORS.items() if c not in ADMIN_ONLY})
    errors = _errors({s: "; ".join(f"`{c}`" for c, e in ERRORS.items()
                                   if e.status == s and c not in ADMIN_ONLY)
                      for s in statuses})
    return {
        "operationId": "oip_infer" + "_version" * bool(extra),
        "summary": f"Run the model on the strings of {INPUT} (1..--max-inputs), answered "
                   f"in {OUTPUT} in order ({REFUSED}: guard:reason per input, only when a "
                   "guard refused one)",
        "security": [{"apiKey": []}, {}],
        "parameters": [
            *_path_params(extra),
            {"name": "Idempotency-Key", "in": "header", "required": False,
             "description": "the same key with the same body runs the model once per account",
             "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY,
                        "pattern": "^[!-~]+$"}},
            {"name": "X-Request-Timeout-Ms", "in": "header", "required": False,
             "description": f"deadline in milliseconds, at least {MIN_TIMEOUT_MS} (the "
                            "request's parameters.timeout, in microseconds, wins)",
             "schema": {"type": "string", "pattern": r"^0*[1-9][0-9]*(\.[0-9]*)?$"}},
        ],
        "requestBody": {"required": True, "content": {
            JSON: {"schema": _request(), "examples": {"two": {"value": {
                "inputs": [{"name": INPUT, "shape": [2], "datatype": "BYTES",
                            "data": ["Heavy rain is forecast", "Shares fell"]}],
                "parameters": {"binary_data_output": False}}}}},
            BINARY: _binary("request", "INPUT's bytes (binary_data_size)")}},
        "responses": {"200": {
            "description": f"{OUTPUT} (and {REFUSED}): in JSON, or in the binary section "
                           "after Inference-Header-Content-Length bytes of JSON",
            "content": {JSON: {"schema": _answer()},
                        BINARY: _binary("answer", "each binary output's bytes in turn "
                                                  "(its binary_data_size)")}},
            **errors},
    }


def _request() -> JsonObject:
    tensor = json_object({"name": {"type": "string", "description": f"{INPUT} in the "
                                   "model's metadata; any name is taken"},
                          "datatype": {"type": "string", "enum": ["BYTES"]},
                          "shape": {"type": "array", "items": {"type": "integer",
                                                               "minimum": 1,
                                                               "maximum": MAX_BATCH},
                                    "minItems": 1, "maxItems": 1},
                          "data": STRINGS}, ["name", "datatype", "shape", "data"])
    output = json_object({"name": {"type": "string", "enum": [OUTPUT, REFUSED]},
                          "parameters": json_object({"binary_data": {"type": "boolean"}})},
                         ["name"])
    params = json_object({"timeout": {"type": "integer", "minimum": 1000,
                                      "description": "microseconds"},
                          "binary_data_output": {"type": "boolean"}})
    return json_object({"id": string(), "parameters": params,
                        "inputs": {"type": "array", "items": tensor,
                                   "minItems": 1, "maxItems": 1},
                        "outputs": {"type": "array", "items": output}}, ["inputs"])


def _answer() -> JsonObject:
    tensor = json_object({"name": string(), "datatype": string(),
                          "shape": {"type": "array", "items": {"type": "integer"}},
                          "data": {"type": "array", "items": string()},
                          "parameters": json_object({"binary_data_size": {"type": "integer"}})},
                         ["name", "datatype", "shape"])
    return json_object({"model_name": string(), "model_version": string(), "id": string(),
                        "outputs": {"type": "array", "items": tensor}},
                       ["model_name", "model_version", "id", "outputs"])


__all__ = ["paths"]
