"""`--grpc-port`: the Open Inference Protocol's gRPC service, `inference.GRPCInferenceService`,
in front of the same door as `/v1` (`api.oip.infer`), on the process's own event loop.

A single process and every gateway of a cell serve it beside HTTP, on the same host; a
cell's gateways bind one port together (SO_REUSEPORT), as they share the HTTP socket. The
caller's key, Idempotency-Key and deadline come as metadata (`authorization: Bearer <key>`,
`idempotency-key`, `x-request-timeout-ms`, else the call's own gRPC deadline; the request's
`timeout` parameter, in microseconds, wins); a refusal is the gRPC status of its HTTP one
(`codec.status_code`) with the door's message, its code and `retry-after` in the trailing
metadata.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any, NoReturn, TypeVar

import orjson
from grpc import aio  # type: ignore[import-untyped, unused-ignore]

import api.oip.grpc_codec as codec
from api.config import Settings
from api.errors import ApiError, to_api_error
from api.http import MIN_TIMEOUT_MS, Routes
from api.oip.grpc import grpc_predict_v2_pb2 as pb
from api.oip.grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from api.oip.infer import infer
from api.oip.meta import INPUT, OUTPUT, PLATFORM, REFUSED, SERVER, model_view, server_ready

log = logging.getLogger("batchgate.grpc")
T = TypeVar("T")

GRACE_S = 5.0
"""How long a stopping server lets calls in flight finish before it cancels them."""
METADATA = ("authorization", "idempotency-key", "x-request-timeout-ms", "traceparent")
_TENSORS = [pb.ModelMetadataResponse.TensorMetadata(name=n, datatype=codec.BYTES, shape=[-1])
            for n in (OUTPUT, REFUSED)]


class ContextWatch:
    """The `ClientWatch` of one call: the client left when the call ends cancelled (its
    deadline passed, it cancelled, or its connection went) before `unwatch`."""

    __slots__ = ("_context", "_leave")

    def __init__(self, context: aio.ServicerContext) -> None:
        self._context = context
        self._leave: Callable[[], object] | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        if self._context.cancelled():
            leave()
            return
        self._leave = leave
        self._context.add_done_callback(self._ended)

    def unwatch(self) -> None:
        self._leave = None

    def _ended(self, context: aio.ServicerContext) -> None:
        leave, self._leave = self._leave, None
        if leave is not None and context.cancelled():
            leave()


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc, unused-ignore]
    """The six calls of the protocol, each answered from the door (`infer`) or its one
    readiness call (`api.oip.meta`)."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes

    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext
                         ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext
                          ) -> pb.ServerReadyResponse:
        try:
            return pb.ServerReadyResponse(ready=await _unbound(server_ready(self.routes)))
        except Exception as exc:
            await _abort(context, to_api_error(exc))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER, version=_version(), extensions=[])

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext
                         ) -> pb.ModelReadyResponse:
        try:
            view = await _unbound(model_view(self.routes, request.name))
        except Exception as exc:
            await _abort(context, to_api_error(exc))
        ready = view is not None and view.ready(request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: aio.ServicerContext) -> pb.ModelMetadataResponse:
        try:
            view = await _unbound(model_view(self.routes, request.name))
        except Exception as exc:
            await _abort(context, to_api_error(exc))
        if view is None or (request.version and request.version not in view.versions):
            named = request.name + (f"@{request.version}" if request.version else "")
            await _abort(context, ApiError("not_found", f"no model named {named!r}"))
        return pb.ModelMetadataResponse(
            name=view.name, versions=sorted(view.versions), platform=PLATFORM,
            inputs=[pb.ModelMetadataResponse.TensorMetadata(
                name=INPUT, datatype=codec.BYTES, shape=[-1])],
            outputs=_TENSORS)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext
                         ) -> pb.ModelInferResponse:
        try:
            decoded = codec.decode(request)
            inferred = await _unbound(infer(
                self.routes, _metadata(context), decoded.texts, request.model_name,
                request.model_version or None, _timeout_ms(request),
                _digested(request, decoded), ContextWatch(context)))
            return codec.encode(inferred, decoded, request)
        except Exception as exc:
            await _abort(context, to_api_error(exc))


async def _unbound(call: Coroutine[Any, Any, T]) -> T:
    """`call` awaited in a task of its own. grpc cancels a call's handler when its client
    leaves, but the door's futures are the core's to settle (a cancelled one would stop
    it): the leaving reaches the door through `ContextWatch` instead, and the task ends
    with the door's own answer, which nobody reads."""
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_unread)
        raise


def _unread(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # read: an ended client's refusal is no error of the server's


def _metadata(context: aio.ServicerContext) -> dict[str, str]:
    """The metadata `infer` reads, by lower-case name (gRPC sends them lower-cased). A call
    with a deadline and no `x-request-timeout-ms` has its deadline for one: the door then
    refuses at once what it could not answer in time, and never runs inputs for a caller
    whose deadline passed, as it does for `/v1`'s header."""
    found: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if key in METADATA and isinstance(value, str):
            if key in found:
                raise ApiError("repeated_header", f"{key} sent more than once")
            found[key] = value
    left = context.time_remaining()
    if "x-request-timeout-ms" not in found and left is not None:
        found["x-request-timeout-ms"] = f"{max(MIN_TIMEOUT_MS, left * 1000):.3f}"
    return found


def _timeout_ms(request: pb.ModelInferRequest) -> str | None:
    """The protocol's `timeout` parameter (microseconds) as milliseconds, or None."""
    if "timeout" not in request.parameters:
        return None
    param = request.parameters["timeout"]
    kind = param.WhichOneof("parameter_choice")
    if kind == "int64_param" and param.int64_param == 0:  # tritonclient's "none"
        return None
    if kind == "int64_param" and param.int64_param > 0:
        return repr(param.int64_param / 1000)
    if kind == "string_param" and param.string_param.isdigit():
        return repr(int(param.string_param) / 1000)
    raise ApiError("invalid_timeout", "the timeout parameter is a number of microseconds")


def _digested(request: pb.ModelInferRequest, decoded: codec.Decoded) -> bytes:
    """What an Idempotency-Key's answer depends on: the model, its version, the strings
    (however they were encoded), and the outputs named; not the deadline."""
    return b"grpc\0" + orjson.dumps([request.model_name, request.model_version,
                                     decoded.texts, decoded.outputs])


async def _abort(context: aio.ServicerContext, error: ApiError) -> NoReturn:
    context.set_trailing_metadata(codec.trailers(error))
    await context.abort(codec.status_code(error.status), error.message)
    raise AssertionError("abort returned")  # it raises: typed NoReturn here for the checker


def _version() -> str:
    try:
        return metadata.version("batchgate")
    except metadata.PackageNotFoundError:
        return ""


def options(settings: Settings, reuse_port: bool) -> list[tuple[str, Any]]:
    """The server's channel options: a request as large as an HTTP body may be, an answer
    of any size, and the port shared with the cell's other gateways where there are some."""
    return [("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if reuse_port else 0)]


@asynccontextmanager
async def serve(routes: Routes, settings: Settings, port: int, *, reuse_port: bool = False,
                grace_s: float = GRACE_S) -> AsyncIterator[aio.Server]:
    """Serve the protocol on `port` at the HTTP host while the block runs; on the way out,
    calls in flight get `grace_s` to finish. Raises OSError when the port cannot be bound."""
    server = aio.server(options=options(settings, reuse_port))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call, unused-ignore]
        InferenceServicer(routes), server)
    address = _address(settings.host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc's way to say the address is taken
        raise OSError(f"--grpc-port: cannot bind {address}: {exc}") from None
    if bound != port:
        raise OSError(f"--grpc-port: cannot bind {address}")
    await server.start()
    log.info("gRPC (Open Inference Protocol) on %s", address)
    try:
        yield server
    finally:
        await server.stop(grace_s)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


__all__ = ["GRACE_S", "METADATA", "ContextWatch", "InferenceServicer", "options", "serve"]
