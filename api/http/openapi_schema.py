"""The building blocks of the OpenAPI document's parts (`api.http.openapi`, the public
surface; `api.http.openapi_admin`, the admin API): operations, objects and error answers
written once, each error answer from `api/errors.ERRORS`."""

from __future__ import annotations

from typing import Any

from api.errors import ERRORS

JsonObject = dict[str, Any]
ERROR_REF = "#/components/schemas/Error"
JSON = "application/json"
ADMIN_ONLY = frozenset({"invalid_change", "version_serving",  # only the admin API's
                        "change_not_kept"})


def error_answer(status: int, hot: bool = False,
                 only: tuple[str, ...] | None = None) -> JsonObject:
    """`hot`: the answer of `POST /v1/batchstring` (every code of `status` but the admin
    API's, and its headers); else the codes `only` names."""
    codes = {c: e for c, e in ERRORS.items() if e.status == status
             and (c not in ADMIN_ONLY if hot else only is None or c in only)}
    headers = {"Server-Timing": header_ref("Server-Timing"),
               "Idempotent-Replayed": header_ref("Idempotent-Replayed")} if hot else {}
    if hot and status in (429, 503):
        headers["Retry-After"] = header_ref("Retry-After")
    if hot and status == 422:  # `refused`: a guard may have failed open for it too
        headers["Guard-Skipped"] = header_ref("Guard-Skipped")
    return {
        "description": "; ".join(f"`{c}`: {e.when}" for c, e in codes.items()),
        **({"headers": headers} if headers else {}),
        "content": {JSON: {
            "schema": {"allOf": [{"$ref": ERROR_REF}, json_object({"error": json_object(
                {"code": {"type": "string", "enum": list(codes)}, "message": string()})})]},
            "examples": {c: {"value": {"error": {"code": c, "message": e.when}}}
                         for c, e in codes.items()}}},
    }


def error_schema(codes: list[str]) -> JsonObject:
    error = json_object({"code": {"type": "string", "enum": codes}, "message": string(),
                         "refused": refusals_schema()},
                        ["code", "message"])
    return json_object({"error": error}, ["error"])


def refusals_schema() -> JsonObject:
    """The inputs guards refused (an answer's, or a `refused` error's): never the guard's
    text, only its name and reason code."""
    refusal = json_object({"index": {"type": "integer", "minimum": 0}, "guard": string(),
                           "reason": {"type": "string", "pattern": "^[a-z0-9_]{1,64}$"}},
                          ["index", "guard", "reason"])
    return {"type": "array", "items": refusal, "minItems": 1,
            "description": "each input a guard refused: its index, the guard and its reason"}


def operation(what: str, schema: JsonObject) -> JsonObject:
    """A GET answering `schema`, described by `what`."""
    return {"summary": what, "responses": {"200": {"description": what, "content": {
        JSON: {"schema": schema}}}}}


def json_object(props: JsonObject, required: list[str] | None = None,
                exclude: str | None = None) -> JsonObject:
    out: JsonObject = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if exclude:
        out["not"] = {"required": [exclude]}
    return out


def stream_event_schema() -> JsonObject:
    """One event of a streamed answer (`api.stream.events`)."""
    error = json_object({"code": string(), "message": string(), "guard": string(),
                         "reason": string()}, ["code", "message"])
    index = {"type": "integer", "minimum": 0, "description": "the input's place in the request"}
    counts = json_object({"outputs": {"type": "integer"}, "errors": {"type": "integer"}},
                         ["outputs", "errors"])
    return {"oneOf": [
        json_object({"index": index, "output": string(),
                     "guard_skipped": {"type": "array", "items": string()}},
                    ["index", "output"]),
        json_object({"index": index, "error": error}, ["index", "error"]),
        json_object({"done": {"const": True}, "id": string(), "model": string(),
                     "counts": counts}, ["done", "id", "model", "counts"]),
    ]}


def string() -> JsonObject:
    return {"type": "string"}


def header_ref(name: str) -> JsonObject:
    return {"$ref": f"#/components/headers/{name}"}


__all__ = ["ADMIN_ONLY", "ERROR_REF", "JSON", "JsonObject", "error_answer", "error_schema",
           "header_ref", "json_object", "operation", "refusals_schema", "stream_event_schema",
           "string"]
