"""The OpenAPI 3.1 document of the HTTP surface, built from what the server enforces.

Nothing here is written twice: the request schema's limits come from the running
settings (the same `Limits` that `parse_body` applies), the error codes per status from
`api/errors.ERRORS`, the worker record from `WORKER_FIELDS` (held to `WorkerInfo` by a
test). A test sends every example through `parse_body`, and schemathesis holds the live
server to the document. Which models are served changes while serving, and a gateway never
knows: the document names none."""

from __future__ import annotations

from html import escape
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from api.errors import ERRORS
from api.http.parsing import MIN_TIMEOUT_MS, MODEL_NAME, Limits
from api.http.routes import MAX_IDEMPOTENCY_KEY

JsonObject = dict[str, Any]
ERROR_REF = "#/components/schemas/Error"
JSON = "application/json"
ADMIN_ONLY = frozenset({"invalid_change"})  # codes only the admin API answers
NAME = MODEL_NAME.pattern.partition("(")[0]  # a model's or a version's name
VERSION_STATES = ["resident", "loading", "cold", "retired"]

REQUEST_EXAMPLES: dict[str, JsonObject] = {
    "one": {"summary": "one input", "value": {"input": "The striker scored twice"}},
    "many": {"summary": "several inputs, answered in order",
             "value": {"inputs": ["Heavy rain is forecast", "Shares fell sharply"]}},
}
ANSWER_EXAMPLES: dict[str, JsonObject] = {
    "one": {"value": {"id": "3159b9d8d7ae4279", "output": "sports", "model": "default@v1"}},
    "many": {"value": {"id": "f2572be43b88a77a", "outputs": ["weather", "business"],
                       "model": "default@v1"}},
}


def document(limits: Limits, version: str = "0.1.0") -> JsonObject:
    """The whole document for a server that enforces `limits`."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "batchgate", "version": version,
                 "description": "Fixed-batch dispatch and collation for GPU inference: each "
                                "request's inputs ride in batches of at most 100 and it gets "
                                "exactly its own outputs back."},
        "paths": {
            "/v1/batchstring": {"post": _batchstring()},
            "/healthz": {"get": _get("the process is alive", _object({"status": _str()}))},
            "/readyz": {"get": _readyz()},
            "/metrics": {"get": _metrics()},
            "/admin/workers": {"get": _admin_workers()},
            "/admin/models": {"get": _admin_models()},
            "/admin/models/{name}": {"put": _admin_change()},
            "/admin/models/{name}/versions/{version}": {"delete": _admin_retire()},
            "/openapi.json": {"get": _get("this document", {"type": "object"})},
            "/docs": {"get": _docs()},
        },
        "components": {
            "schemas": {"Request": _request(limits), "Answer": _answer(),
                        "Error": _error(sorted(ERRORS)), "Worker": _worker(),
                        "Models": _models(), "ModelChange": _model_change()},
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer",
                           "description": "an API key from the keys file: its tier and account"},
                "adminKey": {"type": "http", "scheme": "bearer",
                             "description": "an admin key (keys file or BATCHGATE_ADMIN_KEY)"},
            },
            "headers": {
                "Server-Timing": {"required": True, "schema": _str(),
                                  "description": "queue;dur=<ms>, batch;dur=<ms> on an "
                                                 "answer; total;dur=<ms> on errors and replays"},
                "Retry-After": {"required": True, "schema": {"type": "string",
                                                             "pattern": "^[0-9]+$"},
                                "description": "whole seconds to wait before retrying"},
                "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]},
                                        "description": "the answer was stored or joined"},
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


def openapi_routes(limits: Limits) -> list[Route]:
    """`GET /openapi.json` and `GET /docs`, built once."""
    doc = document(limits)
    body, page = orjson.dumps(doc), docs_page(doc)

    async def openapi(request: Request) -> Response:
        return Response(body, media_type=JSON)

    async def docs(request: Request) -> Response:
        return HTMLResponse(page)

    return [Route("/openapi.json", openapi, methods=["GET"]),
            Route("/docs", docs, methods=["GET"])]


def _batchstring() -> JsonObject:
    statuses = sorted({e.status for e in ERRORS.values()} - {404, 405})
    responses: JsonObject = {"200": {
        "description": "every input's output, in order",
        "headers": {"Server-Timing": _header_ref("Server-Timing"),
                    "Idempotent-Replayed": _header_ref("Idempotent-Replayed")},
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/Answer"},
                           "examples": ANSWER_EXAMPLES}}}}
    for status in statuses:
        responses[str(status)] = _error_response(status, hot=True)
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
        ],
        "requestBody": {"required": True, "content": {JSON: {
            "schema": {"$ref": "#/components/schemas/Request"},
            "examples": REQUEST_EXAMPLES}}},
        "responses": responses,
    }


def _error_response(status: int, hot: bool = False,
                    only: tuple[str, ...] | None = None) -> JsonObject:
    """`hot`: the answer of `POST /v1/batchstring` (every code of `status` but the admin
    API's, and its headers); else the codes `only` names."""
    codes = {c: e for c, e in ERRORS.items() if e.status == status
             and (c not in ADMIN_ONLY if hot else only is None or c in only)}
    headers = {"Server-Timing": _header_ref("Server-Timing"),
               "Idempotent-Replayed": _header_ref("Idempotent-Replayed")} if hot else {}
    if hot and status in (429, 503):
        headers["Retry-After"] = _header_ref("Retry-After")
    return {
        "description": "; ".join(f"`{c}`: {e.when}" for c, e in codes.items()),
        **({"headers": headers} if headers else {}),
        "content": {JSON: {
            "schema": {"allOf": [{"$ref": ERROR_REF}, _object({"error": _object(
                {"code": {"type": "string", "enum": list(codes)}, "message": _str()})})]},
            "examples": {c: {"value": {"error": {"code": c, "message": e.when}}}
                         for c, e in codes.items()}}},
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
             "examples": ["default", "topics", "topics@v2"]}
    return {
        "description": f"exactly one of input and inputs; the body is at most "
                     f"{limits.max_body_bytes} bytes",
        "oneOf": [
            _object({"input": text, "model": model}, ["input"], exclude="inputs"),
            _object({"inputs": {"type": "array", "items": text, "minItems": 1,
                                "maxItems": limits.max_inputs}, "model": model},
                    ["inputs"], exclude="input"),
        ],
    }


def _answer() -> JsonObject:
    model = {"type": "string", "pattern": f"^{MODEL_NAME.pattern}$",
             "description": "the version that ran it, model@version (`default@v1` with "
                            "`--model`)"}
    return {"oneOf": [_object({"id": _str(), "output": _str(), "model": model},
                              ["id", "output", "model"]),
                      _object({"id": _str(), "outputs": {"type": "array", "items": _str()},
                               "model": model}, ["id", "outputs", "model"])]}


def _error(codes: list[str]) -> JsonObject:
    return _object({"error": _object({"code": {"type": "string", "enum": codes},
                                      "message": _str()}, ["code", "message"])}, ["error"])


WORKER_FIELDS: dict[str, type | tuple[type, None]] = {
    "id": int, "slot": int, "pid": (int, None), "state": str, "device": str, "batches": int,
    "restarts": int, "node": str, "version": str,
}
"""`gpu_pool.WorkerInfo` as `/admin/workers` shows it, written out: a gateway serves this
document without loading the pool. A test holds it to the dataclass's fields."""
WORKER_STATES = ["pending", "starting", "switching", "ready", "busy", "dead", "stopped"]
# "pending": a Ray actor waiting for a node with room (`--pool ray`)


def _worker() -> JsonObject:
    kinds = {int: "integer", str: "string"}
    props: JsonObject = {}
    for name, kind in WORKER_FIELDS.items():
        if isinstance(kind, tuple):  # X | None
            props[name] = {"type": [kinds[kind[0]], "null"]}
        else:
            props[name] = _str() if kind is str else {"type": kinds[kind]}
    props["state"]["enum"] = WORKER_STATES
    return _object(props, list(WORKER_FIELDS))


def _readyz() -> JsonObject:
    states = {"type": "object", "propertyNames": {"pattern": f"^{MODEL_NAME.pattern}$"},
              "additionalProperties": {"type": "string", "enum": VERSION_STATES},
              "description": "each version the core holds, model@version, by its state",
              "examples": [{"default@v1": "resident"}]}
    body = _object({"ready": {"type": "boolean"}, "workers_ready": {"type": "integer"},
                    "draining": {"type": "boolean"}, "models": states},
                   ["ready", "workers_ready", "draining"])
    ok = _get("a worker holds the version a request without `model` gets, and the server "
              "is not draining", body)
    ok["responses"]["503"] = {"description": "no such worker, or draining",
                              "content": {JSON: {"schema": body}}}
    return ok


def _metrics() -> JsonObject:
    return {"summary": "Prometheus text format",
            "responses": {"200": {"description": "every batchgate_* metric",
                                  "content": {"text/plain": {"schema": _str()}}}}}


def _docs() -> JsonObject:
    return {"summary": "this document as a page (no script, no network)",
            "responses": {"200": {"description": "HTML",
                                  "content": {"text/html": {"schema": _str()}}}}}


def _admin_workers() -> JsonObject:
    gateway = _object({"slot": {"type": "integer"}, "pid": {"type": ["integer", "null"]},
                       "state": {"type": "string",
                                 "enum": ["starting", "running", "restarting", "stopped"]},
                       "restarts": {"type": "integer"}}, ["slot", "pid", "state", "restarts"])
    core = _object({"pid": {"type": ["integer", "null"]},
                    "state": {"type": "string",
                              "enum": ["starting", "running", "restarting", "stopped"]},
                    "restarts": {"type": "integer"}, "incarnation": {"type": "integer"}},
                   ["pid", "state", "restarts", "incarnation"])
    body = _object({"workers": {"type": "array",
                                "items": {"$ref": "#/components/schemas/Worker"}},
                    "gateways": {"type": "array", "items": gateway,
                                 "description": "the HTTP gateway processes (--gateways K); "
                                                "empty in a single process"},
                    "core": {"oneOf": [core, {"type": "null"}],
                             "description": "the core process of a cell, which its "
                                            "supervisor restarts; null in a single process"}},
                   ["workers", "gateways", "core"])
    return _admin("each worker of the pool, and a cell's gateway and core processes", body)


MODELS_REF = {"$ref": "#/components/schemas/Models"}
MODELS_EXAMPLE = {"models": [{
    "name": "topics", "default": "v2", "serving_default": "v1", "weights": {},
    "min_workers": 1, "max_workers": 4, "idle_unload_s": 600.0, "versions": [
        {"version": "v1", "spec": "minilm", "state": "resident", "resident_workers": 2,
         "loading": 0, "queued": 3, "load_s": 4.2, "load_s_hint": None},
        {"version": "v2", "spec": "mypkg.topics_v2:batchstring", "state": "loading",
         "resident_workers": 0, "loading": 1, "queued": 0, "load_s": None,
         "load_s_hint": 40.0}]}]}


def _models() -> JsonObject:
    maybe = {"type": ["number", "null"]}
    version = _object({
        "version": _str(), "spec": _str(),
        "state": {"type": "string", "enum": VERSION_STATES},
        "resident_workers": {"type": "integer"}, "loading": {"type": "integer"},
        "queued": {"type": "integer"},
        "load_s": {**maybe, "description": "measured load time (null: none yet)"},
        "load_s_hint": {**maybe, "description": "the catalogue's hint"}},
        ["version", "spec", "state", "resident_workers", "loading", "queued", "load_s",
         "load_s_hint"])
    model = _object({
        "name": _str(), "default": _str(),
        "serving_default": {"type": ["string", "null"], "description": "the version a "
                            "request without @version gets now: the old default until a "
                            "new one is resident (or the rollout timeout passed)"},
        "weights": {"type": "object", "additionalProperties": {"type": "integer"}},
        "min_workers": {"type": "integer"}, "max_workers": {"type": ["integer", "null"]},
        "idle_unload_s": {"type": "number"}, "versions": {"type": "array", "items": version}},
        ["name", "default", "serving_default", "weights", "min_workers", "max_workers",
         "idle_unload_s", "versions"])
    return _object({"models": {"type": "array", "items": model}}, ["models"])


def _model_change() -> JsonObject:
    out = _object({
        "default": {"type": "string", "pattern": f"^{NAME}$",
                    "description": "a live version of the model: takes traffic once as "
                                   "warm as the old one"},
        "weights": {"type": "object", "additionalProperties": {"type": "integer",
                    "minimum": 0}, "propertyNames": {"pattern": f"^{NAME}$"},
                    "description": "percent per live version, adding up to 100; {} "
                                   "removes them"},
        "min_workers": {"type": "integer", "minimum": 0},
        "max_workers": {"type": "integer", "minimum": 1}})
    return {**out, "minProperties": 1, "additionalProperties": False,
            "description": "the settings to change; the others stay as they are"}


def _admin(what: str, body: JsonObject, codes: dict[int, tuple[str, ...]] | None = None,
           example: JsonObject | None = None, path: tuple[str, ...] = ()) -> JsonObject:
    """An admin operation answering `body`, or the errors of `codes` (status -> codes);
    `path`: its path parameters (a model's name, a version's)."""
    out = _get(what, body)
    if path:
        out["parameters"] = [{"name": name, "in": "path", "required": True, "schema": _str(),
                              "description": f"the {'model' if name == 'name' else name}",
                              "examples": {"one": {"value": "topics" if name == "name"
                                                   else "v1"}}} for name in path]
    if example is not None:
        out["responses"]["200"]["content"][JSON]["examples"] = {"one": {"value": example}}
    out["security"] = [{"adminKey": []}]
    for status, only in {401: ("unauthorized",), **(codes or {})}.items():
        out["responses"][str(status)] = _error_response(status, only=only)
    return out


def _admin_models() -> JsonObject:
    return _admin("each model and version: state, workers, queue, load time, weights",
                  MODELS_REF, example=MODELS_EXAMPLE)


def _admin_change() -> JsonObject:
    out = _admin("change a model's default, weights or worker bounds (only versions the "
                 "catalogue names; a change that leaves it invalid changes nothing)",
                 MODELS_REF, {400: ("invalid_request",), 404: ("not_found",),
                              413: ("body_too_large",), 422: ("invalid_change",)},
                 path=("name",))
    out["requestBody"] = {"required": True, "content": {JSON: {
        "schema": {"$ref": "#/components/schemas/ModelChange"},
        "examples": {"rollout": {"summary": "a new default", "value": {"default": "v2"}},
                     "canary": {"summary": "a split",
                                "value": {"weights": {"v1": 90, "v2": 10}}}}}}}
    return out


def _admin_retire() -> JsonObject:
    return _admin("retire a version: no new requests, its queue finishes, then it is "
                  "unloaded (never the default)", MODELS_REF,
                  {404: ("not_found",), 422: ("invalid_change",)}, path=("name", "version"))


def _get(what: str, schema: JsonObject) -> JsonObject:
    return {"summary": what, "responses": {"200": {"description": what, "content": {
        JSON: {"schema": schema}}}}}


def _object(props: JsonObject, required: list[str] | None = None,
            exclude: str | None = None) -> JsonObject:
    out: JsonObject = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if exclude:
        out["not"] = {"required": [exclude]}
    return out


def _str() -> JsonObject:
    return {"type": "string"}


def _header_ref(name: str) -> JsonObject:
    return {"$ref": f"#/components/headers/{name}"}


__all__ = ["ANSWER_EXAMPLES", "REQUEST_EXAMPLES", "docs_page", "document", "openapi_routes"]
