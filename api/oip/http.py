"""The Open Inference Protocol's HTTP routes (`/v2`), beside `/v1` on the same server: health,
metadata, readiness and infer, so that an unmodified `tritonclient.http` (or any KServe v2
client) uses batchgate. An infer goes through the same door as `/v1/batchstring`
(`api.oip.infer`); the tensors are `api.oip.tensors`'.

Errors are the protocol's shape, `{"error": message}`, with batchgate's `code` beside it and
the door's status and headers (a refusal's Retry-After kept): tritonclient raises them as
`InferenceServerException` with that status. Nothing here is on `/v1`'s hot path.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from api.errors import ApiError, to_api_error
from api.http import DocumentedRoute, Outcome, RawCall, Routes, read_body
from api.oip.infer import Inferred, infer, inferred
from api.oip.meta import INPUT, OUTPUT, PLATFORM, SERVER, ModelView, model_view, server_ready
from api.oip.openapi import paths
from api.oip.tensors import InferRequest, decode_request, encode_answer

JSON = "application/json"
BINARY = "application/octet-stream"
HEADER_LENGTH = "inference-header-content-length"
EXTENSIONS = ["binary_tensor_data"]
NOT_READY = "Model version not ready"  # Triton's words, with its 400
TENSOR = {"datatype": "BYTES", "shape": [-1]}
INFER = "/v2/models/{name}/infer"  # the infer's route, as the access log and its span name it


def _version() -> str:
    try:
        return version("batchgate")
    except PackageNotFoundError:  # run from a tree that was never installed
        return "0"


Handler = Callable[[Request], Awaitable[Response]]


class OipHttp:
    """The handlers, over the same `Routes` as `/v1`."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes
        self.server = orjson.dumps({"name": SERVER, "version": _version(),
                                    "extensions": EXTENSIONS})

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if await server_ready(self.routes) else 503)

    async def metadata(self, request: Request) -> Response:
        return Response(self.server, media_type=JSON)

    async def model_metadata(self, request: Request) -> Response:
        name, wanted = request.path_params["name"], request.path_params.get("version")
        view = await self._model(name, wanted)
        body = {"name": name, "versions": [wanted] if wanted else sorted(view.versions),
                "platform": PLATFORM, "inputs": [{"name": INPUT, **TENSOR}],
                "outputs": [{"name": OUTPUT, **TENSOR}]}
        return Response(orjson.dumps(body), media_type=JSON)

    async def model_ready(self, request: Request) -> Response:
        wanted = request.path_params.get("version")
        view = await self._model(request.path_params["name"], wanted)
        if view.ready(wanted):
            return Response(status_code=200)
        return Response(orjson.dumps({"error": NOT_READY}), 400, media_type=JSON)

    async def model_infer(self, request: Request) -> Response:
        """Read, decode, run through the door, encode. The call is its own client watch:
        the body is read from it, and it hears the client leave while the answer waits."""
        call = RawCall(request.scope, request.receive)
        headers = call.headers
        started = time.perf_counter()
        try:
            unencoded(headers)
            body = await read_body(headers, call.stream(), self.routes.limits.max_body_bytes)
            asked = decode_request(body, headers.get(HEADER_LENGTH))
        except Exception as exc:  # refused before the door: counted here, as /v1 does
            err = to_api_error(exc)
            self.routes.record_later("unknown", err.status, time.perf_counter() - started, ())
            return error_response(err)
        params = request.path_params
        answer = await infer(self.routes, headers, asked.texts, params["name"],
                             params.get("version"), asked.timeout_ms, body, call,
                             span=f"POST {INFER}")
        return answered(answer, asked)

    async def _model(self, name: str, wanted: str | None) -> ModelView:
        view = await model_view(self.routes, name)
        if view is None or (wanted is not None and wanted not in view.versions):
            shown = name if wanted is None else f"{name}@{wanted}"
            raise ApiError("not_found", f"no model {shown!r} is served")
        return view


def unencoded(headers: Mapping[str, str]) -> None:
    """Refuse a compressed body (415): nothing here decodes one."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise ApiError("unsupported_media_type",
                       f"Content-Encoding {encoding!r} is not supported: send the body "
                       "uncompressed")


def answered(answer: Inferred, asked: InferRequest) -> Response:
    """An infer's answer, in JSON or with binary tensors as `asked`."""
    content, header_length = encode_answer(answer, asked)
    extra = {} if not answer.skipped else {"Guard-Skipped": ",".join(answer.skipped)}
    if header_length is None:
        return Response(content, media_type=JSON, headers=extra)
    return Response(content, media_type=BINARY,
                    headers={"Inference-Header-Content-Length": str(header_length), **extra})


def answer_response(outcome: Outcome, model: str, asked: InferRequest
                    ) -> tuple[Response, str | None]:
    """The answer to the door's `outcome` (the direct way's), and its id; raises the
    ApiError of a refusal."""
    answer = inferred(outcome, model, len(asked.texts))
    return answered(answer, asked), answer.id


def error_response(err: ApiError) -> Response:
    """`err` in the protocol's shape, with its status and headers."""
    return Response(orjson.dumps({"error": err.message, "code": err.code}),
                    status_code=err.status, headers=err.headers, media_type=JSON)


def protocol_errors(handler: Handler) -> Handler:
    """`handler` answering whatever it raises in the protocol's shape (never a traceback:
    what is not batchgate's own is a 500 `internal`, logged)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return error_response(to_api_error(exc))

    return wrapped


def oip_routes(routes: Routes) -> list[BaseRoute]:
    """The `/v2` routes over `routes`, each with its part of the OpenAPI document."""
    side = OipHttp(routes)
    doc = paths()
    model = "/v2/models/{name}"
    version = model + "/versions/{version}"
    table: list[tuple[str, str, Handler]] = [  # infer first: the router tries them in order
        (model + "/infer", "POST", side.model_infer),
        (version + "/infer", "POST", side.model_infer),
        ("/v2/health/live", "GET", side.live),
        ("/v2/health/ready", "GET", side.ready),
        ("/v2", "GET", side.metadata),
        (model, "GET", side.model_metadata),
        (version, "GET", side.model_metadata),
        (model + "/ready", "GET", side.model_ready),
        (version + "/ready", "GET", side.model_ready),
    ]
    out: list[BaseRoute] = []
    for path, method, handler in table:
        operations: dict[str, Any] = doc[path]
        out.append(DocumentedRoute(path, protocol_errors(handler), methods=[method],
                                   operations=operations))
    return out


__all__ = ["INFER", "OipHttp", "answer_response", "answered", "error_response", "oip_routes",
           "unencoded"]
