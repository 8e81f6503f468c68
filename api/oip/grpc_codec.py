"""The tensors of `ModelInfer` as batchgate reads and writes them, and the gRPC status of a
refusal: pure functions of the protocol's messages, so that every malformed shape is
refused with a message (INVALID_ARGUMENT) before the door is asked.

An input is one BYTES tensor of shape [n] or [n, 1], its elements UTF-8 strings, given as
`contents.bytes_contents` or as the request's `raw_input_contents` (each element a 4-byte
little-endian length and its bytes: what tritonclient sends by default). The answer comes
back the way the request came: raw for raw, `contents` otherwise.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc  # type: ignore[import-untyped, unused-ignore]

from api.errors import ApiError
from api.oip.grpc import grpc_predict_v2_pb2 as pb
from api.oip.infer import Inferred
from api.oip.meta import INPUT, OUTPUT, REFUSED

BYTES = "BYTES"
_LENGTH = struct.Struct("<I")

STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""An HTTP status (`api.errors.ERRORS`) as a gRPC status code; any other is INTERNAL."""


def status_code(status: int) -> grpc.StatusCode:
    return STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


@dataclass(frozen=True, slots=True)
class Decoded:
    """What a `ModelInferRequest` asks: its strings, whether they came raw (the answer goes
    back the same way), and the outputs it names (empty: all of them)."""

    texts: list[str]
    raw: bool
    outputs: tuple[str, ...]


def decode(request: pb.ModelInferRequest) -> Decoded:
    """The request's strings; ApiError (INVALID_ARGUMENT) for any other shape."""
    if len(request.inputs) != 1:
        raise _invalid(f"one input tensor ({INPUT}) is taken, got {len(request.inputs)}")
    tensor = request.inputs[0]
    if tensor.datatype != BYTES:
        raise _invalid(f"the input tensor is BYTES, got {tensor.datatype or 'no datatype'}")
    shape = list(tensor.shape)
    if len(shape) not in (1, 2) or shape[0] < 0 or shape[1:] not in ([], [1]):
        raise _invalid(f"the input tensor's shape is [n] or [n, 1], got {shape}")
    raw = len(request.raw_input_contents) > 0
    if raw and tensor.HasField("contents"):
        raise _invalid("the input is given both raw and in contents")
    if raw:
        if len(request.raw_input_contents) != 1:
            raise _invalid("raw_input_contents holds one entry per input tensor")
        elements = list(_raw_elements(request.raw_input_contents[0]))
    else:
        elements = list(tensor.contents.bytes_contents)
    if len(elements) != shape[0]:
        raise _invalid(f"the input tensor's shape says {shape[0]} elements, "
                       f"its contents hold {len(elements)}")
    outputs = tuple(o.name for o in request.outputs)
    for name in outputs:
        if name not in (OUTPUT, REFUSED):
            raise _invalid(f"no output named {name!r}: {OUTPUT} and {REFUSED} are")
    return Decoded([_text(e, i) for i, e in enumerate(elements)], raw, outputs)


def encode(inferred: Inferred, decoded: Decoded, request: pb.ModelInferRequest
           ) -> pb.ModelInferResponse:
    """The answer: OUTPUT, and REFUSED when a guard refused some input (each as asked)."""
    response = pb.ModelInferResponse(model_name=request.model_name,
                                     model_version=inferred.version, id=request.id)
    tensors = [(OUTPUT, inferred.outputs)]
    if inferred.refused:
        tensors.append((REFUSED, inferred.refused))
    for name, values in tensors:
        if decoded.outputs and name not in decoded.outputs:
            continue
        elements = [v.encode() for v in values]
        tensor = response.outputs.add(name=name, datatype=BYTES, shape=[len(elements)])
        if decoded.raw:
            response.raw_output_contents.append(raw_bytes(elements))
        else:
            tensor.contents.bytes_contents.extend(elements)
    return response


def raw_bytes(elements: Iterable[bytes]) -> bytes:
    """BYTES elements in the protocol's raw form: each a 4-byte little-endian length and
    its bytes."""
    return b"".join(_LENGTH.pack(len(e)) + e for e in elements)


def _raw_elements(raw: bytes) -> Iterator[bytes]:
    at = 0
    while at < len(raw):
        if at + _LENGTH.size > len(raw):
            raise _invalid("raw_input_contents ends inside an element's 4-byte length")
        (size,) = _LENGTH.unpack_from(raw, at)
        at += _LENGTH.size
        if at + size > len(raw):
            raise _invalid("raw_input_contents ends inside an element")
        yield raw[at:at + size]
        at += size


def _text(element: bytes, index: int) -> str:
    try:
        return element.decode()
    except UnicodeDecodeError:
        raise _invalid(f"input element {index} is not UTF-8") from None


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message)


def trailers(error: ApiError) -> Sequence[tuple[str, str]]:
    """A refusal's trailing metadata: its code, and when to try again (`retry-after`,
    seconds, on RESOURCE_EXHAUSTED and UNAVAILABLE)."""
    retry = {k.lower(): v for k, v in error.headers.items()}.get("retry-after")
    return (("batchgate-error-code", error.code),
            *((("retry-after", retry),) if retry is not None else ()))


__all__ = ["BYTES", "STATUS_CODES", "Decoded", "decode", "encode", "raw_bytes", "status_code",
           "trailers"]
