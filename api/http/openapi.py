"""The OpenAPI 3.1 document of the HTTP surface, built from what the server enforces.

Nothing here is written twice: the request schema's limits come from the running
settings (the same `Limits` that `parse_body` applies), the error codes per status from
`api/errors.ERRORS`, the worker record from `WORKER_FIELDS` (held to `WorkerInfo` by a
test; the admin API's part is `api.http.openapi_admin`). A test sends every example
through `parse_body`, and schemathesis holds the live server to the document. Which
models are served changes while serving, and a gateway never knows: the document names
none."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from html import escape
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from api.errors import ERRORS
from api.http.openapi_admin import (
    MODELS_EXAMPLE,
    VERSION_STATES,
    admin_change,
    admin_forget,
    admin_models,
    admin_retire,
    admin_workers,
    model_change_schema,
    models_schema,
    worker_schema,
)
from api.http.openapi_schema import (
    ADMIN_ONLY,
    JSON,
    JsonObject,
    error_answer,
    error_schema,
    header_ref,
    json_object,
    operation,
    refusals_schema,
    stream_event_schema,
    string,
)
from api.http.parsing import MIN_TIMEOUT_MS, MODEL_NAME, Limits
from api.http.routes import MAX_IDEMPOTENCY_KEY

REQUEST_EXAMPLES: dict[str, JsonObject] = {
    "one": {"summary": "one input", "value": {"input": "The striker scored twice"}},
    "many": {"summary": "several inputs, answered in order",
             "value": {"inputs": ["Heavy rain is forecast", "Shares fell sharply"]}},
}
ANSWER_EXAMPLES: dict[str, JsonObject] = {
    "one": {"value": {"id": "3159b9d8d7ae4279", "output": "sports", "model": "default@v1"}},
    "many": {"value": {"id": "f2572be43b88a77a", "outputs": ["weather", "business"],
                       "model": "default@v1"}},
    "some_refused": {"value": {"id": "0d4e7d1c9a2b5f36", "outputs": ["weather", None],
                               "refused": [{"index": 1, "guard": "safety",
                                            "reason": "toxic"}],
                               "model": "topics@v1"}},
}


class DocumentedRoute(Route):
    """A route that brings its own part of the document (`operations`, by method): how a
    surface mounted from outside api/http (`http_app`'s `extra`, as the Open Inference
    Protocol's `/v2`) is documented without this room importing it."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, methods: list[str],
                 operations: JsonObject) -> None:
        super().__init__(path, endpoint, methods=methods)
        self.operations = operations


def documented(routes: Iterable[BaseRoute]) -> JsonObject:
    """The paths of `routes` that bring their operations, merged by path."""
    out: JsonObject = {}
    for route in routes:
        if isinstance(route, DocumentedRoute):
            out.setdefault(route.path, {}).update(route.operations)
    return out


def document(limits: Limits, version: str = "0.1.0", extra: JsonObject | None = None
             ) -> JsonObject:
    """The whole document for a server that enforces `limits`; `extra`: more paths (a
    surface mounted beside these, `documented`)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "batchgate", "version": version,
                 "description": "Fixed-batch dispatch and collation for GPU inference: each "
                                "request's inputs ride in batches of at most 100 and it gets "
                                "exactly its own outputs back."},
        "paths": {
            "/v1/batchstring": {"post": _batchstring()},
            "/healthz": {"get": operation("the process is alive",
                                          json_object({"status": string()}))},
            "/readyz": {"get": _readyz()},
            "/metrics": {"get": _metrics()},
            "/admin/workers": {"get": admin_workers()},
            "/admin/models": {"get": admin_models()},
            "/admin/models/{name}": {"put": admin_change()},
            "/admin/models/{name}/versions/{version}": {"delete": admin_retire()},
            "/admin/models/{name}/overrides": {"delete": admin_forget()},
            "/openapi.json": {"get": operation("this document", {"type": "object"})},
            "/docs": {"get": _docs()},
            **(extra or {}),
        },
        "components": {
            "schemas": {"Request": _request(limits), "Answer": _answer(),
                        "Error": error_schema(sorted(ERRORS)), "Worker": worker_schema(),
                        "StreamEvent": stream_event_schema(),
                        "Models": models_schema(), "ModelChange": model_change_schema()},
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer",
                           "description": "an API key from the keys file: its tier and account"},
                "adminKey": {"type": "http", "scheme": "bearer",
                             "description": "an admin key (keys file or BATCHGATE_ADMIN_KEY)"},
            },
            "headers": {
                "Server-Timing": {"required": True, "schema": string(),
                                  "description": "queue;dur=<ms>, batch;dur=<ms> on an "
                                                 "answer; total;dur=<ms> on errors and replays"},
                "Retry-After": {"required": True, "schema": {"type": "string",
                                                             "pattern": "^[0-9]+$"},
                                "description": "whole seconds to wait before retrying"},
                "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]},
                                        "description": "the answer was stored or joined"},
                "Guard-Skipped": {"schema": string(),
                                  "description": "the guards (comma-separated) that could "
                                                 "not answer for some input and were "
                                                 "skipped: the model fails open"},
            },
        },
    }


def docs_page(doc: JsonObject) -> str:
    """The document as a plain HTML page: no script, nothing fetched from the network."""
    out = [f"<!doctype html><meta charset=utf-8><title>batchgate API</title>"
           f"<h1>{escape(doc['info']['title'])} {escape(doc['info']['version'])}</h1>"
           f"<p>{escape(doc['info']['description'])} The machine-readable document is at "
           f"<a href=/openapi.json>/openapi.json</a>.</p>"]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            out.append(f"<h2><code>{method.upper()} {escape(path)}</code></h2>"
                       f"<p>{escape(op.get('summary', ''))}</p><ul>")
            for param in op.get("parameters", []):
                out.append(f"<li>header <code>{escape(param['name'])}</code>: "
                           f"{escape(param['description'])}</li>")
            for status, response in op["responses"].items():
                out.append(f"<li><b>{status}</b> {escape(response['description'])}</li>")
            out.append("</ul>")
    return "".join(out)


def openapi_routes(limits: Limits, extra: Iterable[BaseRoute] = ()) -> list[Route]:
    """`GET /openapi.json` and `GET /docs`, built once; `extra`: the routes mounted beside
    the HTTP surface's own, whose `DocumentedRoute`s are in the document too."""
    doc = document(limits, extra=documented(extra))
    body, page = orjson.dumps(doc), docs_page(doc)

    async def openapi(request: Request) -> Response:
        return Response(body, media_type=JSON)

    async def docs(request: Request) -> Response:
        return HTMLResponse(page)

    return [Route("/openapi.json", openapi, methods=["GET"]),
            Route("/docs", docs, methods=["GET"])]


def _batchstring() -> JsonObject:
    hot = {e.status for c, e in ERRORS.items() if c not in ADMIN_ONLY}
    statuses = sorted(hot - {404, 405})
    responses: JsonObject = {"200": {
        "description": "every input's output, in order",
        "headers": {"Server-Timing": header_ref("Server-Timing"),
                    "Idempotent-Replayed": header_ref("Idempotent-Replayed"),
                    "Guard-Skipped": header_ref("Guard-Skipped")},
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/Answer"},
                           "examples": ANSWER_EXAMPLES}, **_streamed()}}}
    for status in statuses:
        responses[str(status)] = error_answer(status, hot=True)
    return {
        "operationId": "batchstring",
        "summary": "Run the model on one input or up to --max-inputs inputs",
        "security": [{"apiKey": []}, {}],
        "parameters": [
            {"name": "Idempotency-Key", "in": "header", "required": False,
             "description": "the same key with the same body runs the model once per account "
                            "and replays the answer; with another body, 422",
             "schema": {"type": "string", "minLength": 1,
                        "maxLength": MAX_IDEMPOTENCY_KEY, "pattern": "^[!-~]+$"}},
            {"name": "X-Request-Timeout-Ms", "in": "header", "required": False,
             "description": "deadline in milliseconds, digits with at most one dot, at "
                            f"least {MIN_TIMEOUT_MS} (default: the tier's; capped by "
                            "--max-request-timeout-ms)",
             # the pattern's "at least 1" is MIN_TIMEOUT_MS
             "schema": {"type": "string", "pattern": r"^0*[1-9][0-9]*(\.[0-9]*)?$"}},
            {"name": "Accept", "in": "header", "required": False,
             "description": "text/event-stream or application/x-ndjson: the answer is a "
                            "stream of events (StreamEvent), one per input as its batch "
                            "lands, then `done`; the request may hold up to "
                            "--max-stream-inputs inputs. Anything else: the JSON answer",
             "schema": {"type": "string"}},
            {"name": "Last-Event-ID", "in": "header", "required": False,
             "description": "resume a keyed stream (the same Idempotency-Key and body) "
                            "after the SSE event of this number",
             "schema": {"type": "string", "pattern": "^[0-9]{1,12}$"}},
            {"name": "after", "in": "query", "required": False,
             "description": "resume a keyed NDJSON stream after this many events",
             "schema": {"type": "string", "pattern": "^[0-9]{1,12}$"}},
        ],
        "requestBody": {"required": True, "content": {JSON: {
            "schema": {"$ref": "#/components/schemas/Request"},
            "examples": REQUEST_EXAMPLES}}},
        "responses": responses,
    }


def _streamed() -> JsonObject:
    """A streamed answer's media types (`api.stream`): their bodies are events."""
    return {
        "text/event-stream": {"schema": {
            "type": "string", "description": "Server-Sent Events: `id: <n>` (its number in "
            "the stream, 0, 1, 2, ... in the order sent) and `data: <StreamEvent>` each"}},
        "application/x-ndjson": {"schema": {
            "type": "string", "description": "one StreamEvent a line; a line's number is "
            "the event's"}},
    }


def _request(limits: Limits) -> JsonObject:
    text = {"type": "string", "maxLength": limits.max_input_chars}
    model = {"type": "string", "pattern": f"^{MODEL_NAME.pattern}$",
             "description": "a model of the catalogue (its weighted choice, sticky per "
                            "Idempotency-Key, or its default), or model@version; without "
                            "it, the catalogue's first model (`--model` serves one, "
                            "`default`). One not served now: 422 unknown_model; one still "
                            "loading past the deadline: 503 model_loading (GET /readyz "
                            "lists them)",
             "examples": ["default", "default@v1"]}
    return {
        "description": f"exactly one of input and inputs; the body is at most "
                     f"{limits.max_body_bytes} bytes (a streamed request's: "
                     f"--max-stream-inputs inputs, --max-stream-body-bytes)",
        "oneOf": [
            json_object({"input": text, "model": model}, ["input"], exclude="inputs"),
            json_object({"inputs": {"type": "array", "items": text, "minItems": 1,
                                    "maxItems": limits.max_inputs}, "model": model},
                        ["inputs"], exclude="input"),
        ],
    }


def _answer() -> JsonObject:
    model = {"type": "string", "pattern": f"^{MODEL_NAME.pattern}$",
             "description": "the version that ran it, model@version (`default@v1` with "
                            "`--model`)"}
    outputs = {"type": "array", "items": {"type": ["string", "null"]},
               "description": "each input's output, in order; null where a guard refused "
                              "the input (`refused` says which and why)"}
    return {"oneOf": [json_object({"id": string(), "output": string(), "model": model},
                                  ["id", "output", "model"]),
                      json_object({"id": string(), "outputs": outputs,
                                   "refused": refusals_schema(), "model": model},
                                  ["id", "outputs", "model"])]}


def _readyz() -> JsonObject:
    states = {"type": "object", "propertyNames": {"pattern": f"^{MODEL_NAME.pattern}$"},
              "additionalProperties": {"type": "string", "enum": VERSION_STATES},
              "description": "each version the core holds, model@version, by its state",
              "examples": [{"default@v1": "resident"}]}
    body = json_object({"ready": {"type": "boolean"}, "workers_ready": {"type": "integer"},
                        "draining": {"type": "boolean"}, "models": states,
                        "state": {"type": "string", "description": "only while the `--state` "
                                  "store fails: why (keyed requests get 503 "
                                  "state_unavailable)"}},
                       ["ready", "workers_ready", "draining"])
    ok = operation("some model can serve (a worker holds its serving version, or that version "
                   "loads on demand onto a worker that is up), and the server is not draining",
                   body)
    ok["responses"]["503"] = {"description": "no model can serve, or draining",
                              "content": {JSON: {"schema": body}}}
    return ok


def _metrics() -> JsonObject:
    return {"summary": "Prometheus text format",
            "responses": {"200": {"description": "every batchgate_* metric",
                                  "content": {"text/plain": {"schema": string()}}}}}


def _docs() -> JsonObject:
    return {"summary": "this document as a page (no script, no network)",
            "responses": {"200": {"description": "HTML",
                                  "content": {"text/html": {"schema": string()}}}}}


__all__ = ["ADMIN_ONLY", "ANSWER_EXAMPLES", "MODELS_EXAMPLE", "REQUEST_EXAMPLES",
           "DocumentedRoute", "docs_page", "document", "documented", "openapi_routes"]
