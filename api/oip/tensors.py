"""The Open Inference Protocol's HTTP tensors: an infer request's body read into strings, and
an answer written back, in JSON or with the binary tensor data extension.

A request holds one BYTES input of shape [n] or [n, 1] (model metadata names it `INPUT`; any
name is taken, as the gRPC side takes it, so a client built for another model's tensor name
(PyTriton's `text`, a load tool's) works unchanged): its strings in JSON
(`data`), or after the JSON header in the body's binary section (`binary_data_size` bytes,
each element a 4-byte little-endian length then its bytes; the header's length is the
`Inference-Header-Content-Length` header). The answer holds `OUTPUT` (and `REFUSED` when a
guard refused some input), each in JSON or binary as the request asked (`binary_data_output`,
or an output's own `binary_data`: tritonclient asks for binary unless told otherwise).

Everything malformed is a 400 (`ApiError`), decided before anything runs; a count of strings
outside 1..MAX_BATCH is the door's own refusal (422), as on `/v1`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from api.errors import ApiError
from api.oip.infer import Inferred
from api.oip.meta import INPUT, OUTPUT, REFUSED
from batcher import MAX_BATCH

OUTPUTS = (OUTPUT, REFUSED)
LENGTH = struct.Struct("<I")  # a BYTES element's length prefix
BYTES = "BYTES"


@dataclass(frozen=True, slots=True)
class InferRequest:
    """What an infer request asks, read from its body."""

    texts: list[str]
    timeout_ms: str | None  # the `timeout` parameter (microseconds) in milliseconds
    id: str | None  # echoed in the answer
    binary: frozenset[str]  # the outputs to answer in the binary section


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """Read an infer request: `body` as sent, `header_length` its
    Inference-Header-Content-Length (None: the body is all JSON). Raises ApiError."""
    split = _split(body, header_length)
    try:
        head = orjson.loads(body[:split])
    except orjson.JSONDecodeError as exc:
        raise ApiError("malformed_json", f"the inference header is not valid JSON: {exc}"
                       ) from None
    if not isinstance(head, dict):
        raise _invalid("the inference request must be a JSON object")
    params = _params(head.get("parameters"), "parameters")
    rid = head.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _invalid("'id' must be a string")
    texts = _texts(head.get("inputs"), memoryview(body)[split:])
    return InferRequest(texts, _timeout(params.get("timeout")), rid,
                        _binary(head.get("outputs"), _flag(params, "binary_data_output")))


def encode_answer(answer: Inferred, request: InferRequest) -> tuple[bytes, int | None]:
    """The answer's body, and the length of its JSON header when it has a binary section
    (the Inference-Header-Content-Length of the response; None: all JSON)."""
    tensors: list[tuple[str, list[str]]] = [(OUTPUT, answer.outputs)]
    if answer.refused:
        tensors.append((REFUSED, answer.refused))
    outputs: list[dict[str, Any]] = []
    raw: list[bytes] = []
    for name, values in tensors:
        tensor: dict[str, Any] = {"name": name, "datatype": BYTES, "shape": [len(values)]}
        if name in request.binary:
            data = encode_bytes(values)
            tensor["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            tensor["data"] = values
        outputs.append(tensor)
    head = orjson.dumps({"model_name": answer.model, "model_version": answer.version,
                         "id": answer.id if request.id is None else request.id,
                         "outputs": outputs})
    if not raw:
        return head, None
    return b"".join([head, *raw]), len(head)


def encode_bytes(values: list[str]) -> bytes:
    """A BYTES tensor's binary form: each element's length, then its UTF-8 bytes."""
    parts: list[bytes] = []
    for value in values:
        data = value.encode()
        parts += (LENGTH.pack(len(data)), data)
    return b"".join(parts)


def decode_bytes(raw: memoryview | bytes, n: int) -> list[str]:
    """`n` elements of a BYTES tensor's binary form, which they must fill exactly; 400 if
    they do not, or if one is not UTF-8."""
    out: list[str] = []
    at = 0
    for _ in range(n):
        if at + LENGTH.size > len(raw):
            raise _invalid(f"the binary data of {INPUT} ends inside element {len(out)}")
        (size,) = LENGTH.unpack_from(raw, at)
        at += LENGTH.size
        if at + size > len(raw):
            raise _invalid(f"the binary data of {INPUT} ends inside element {len(out)}")
        out.append(_utf8(bytes(raw[at:at + size])))
        at += size
    if at != len(raw):
        raise _invalid(f"the binary data of {INPUT} holds more than its {n} elements")
    return out


def _split(body: bytes, header_length: str | None) -> int:
    """Where the JSON header ends."""
    if header_length is None:
        return len(body)
    if not header_length.isdigit() or not 0 < int(header_length) <= len(body):
        raise _invalid(f"Inference-Header-Content-Length must be a length within the body's "
                       f"{len(body)} bytes")
    return int(header_length)


def _texts(inputs: object, raw: memoryview) -> list[str]:
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise _invalid(f"'inputs' must hold exactly one tensor, {INPUT}")
    tensor = inputs[0]
    if not isinstance(tensor.get("name"), str):
        raise _invalid("the input tensor has a 'name'")
    if tensor.get("datatype") != BYTES:
        raise _invalid(f"{INPUT}'s datatype must be {BYTES}")
    n = _count(tensor.get("shape"))
    params = _params(tensor.get("parameters"), f"{INPUT}'s parameters")
    if any(key.startswith("shared_memory") for key in params):
        raise _invalid("shared memory is not supported: send the data in the body")
    size = params.get("binary_data_size")
    if size is None:
        if len(raw):
            raise _invalid("the body has binary data that no input claims")
        return _json_data(tensor.get("data"), n)
    if "data" in tensor:
        raise _invalid(f"{INPUT} has both 'data' and 'binary_data_size'")
    if type(size) is not int or size != len(raw):
        raise _invalid(f"{INPUT}'s binary_data_size must be the {len(raw)} bytes after the "
                       f"inference header")
    return decode_bytes(raw, n)


def _count(shape: object) -> int:
    """n, of a shape [n] or [n, 1]."""
    if not isinstance(shape, list) or not 1 <= len(shape) <= 2 \
            or not all(type(d) is int for d in shape) or shape[1:] not in ([], [1]):
        raise _invalid(f"{INPUT}'s shape must be [n] or [n, 1]")
    n: int = shape[0]
    if n < 0:
        raise _invalid(f"{INPUT}'s shape must be [n] or [n, 1]")
    if n == 0:
        raise ApiError("empty_inputs", f"{INPUT} must hold at least one string")
    if n > MAX_BATCH:
        raise ApiError("too_many_inputs", f"{INPUT} holds at most {MAX_BATCH} strings")
    return n


def _json_data(data: object, n: int) -> list[str]:
    if not isinstance(data, list):
        raise _invalid(f"{INPUT} needs 'data' (or binary_data_size)")
    # [n, 1] may come nested, one list per row
    flat = [d[0] if isinstance(d, list) and len(d) == 1 else d for d in data]
    if len(flat) != n or not all(isinstance(s, str) for s in flat):
        raise _invalid(f"{INPUT}'s data must be {n} strings, as its shape says")
    return flat


def _timeout(value: object) -> str | None:
    """The `timeout` parameter (microseconds; 0: none) as milliseconds for the door."""
    if type(value) is float and value.is_integer():  # JSON's 5e6 or 5000000.0: a whole number
        value = int(value)
    if value is None or (value == 0 and type(value) is int):
        return None
    if type(value) is not int or value < 1000:
        raise ApiError("invalid_timeout", "parameters.timeout is a whole number of "
                                          "microseconds, at least 1000 (0: the default)")
    return f"{value // 1000}.{value % 1000:03d}"


def _binary(outputs: object, default: bool) -> frozenset[str]:
    """The outputs to answer in binary: an output's own `binary_data`, else the request's
    `binary_data_output`."""
    if outputs is None:
        return frozenset(OUTPUTS) if default else frozenset()
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise _invalid("'outputs' must be a list of objects")
    binary = {name for name in OUTPUTS if default}
    for output in outputs:
        name = output.get("name")
        if name not in OUTPUTS:
            raise _invalid(f"the outputs are {OUTPUT} and {REFUSED}, not {name!r}")
        params = _params(output.get("parameters"), f"{name}'s parameters")
        if any(key.startswith("shared_memory") or key == "classification" for key in params):
            raise _invalid("shared memory and classification are not supported")
        if "binary_data" in params:
            (binary.add if _flag(params, "binary_data") else binary.discard)(name)
    return frozenset(binary)


def _params(value: object, what: str) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"{what} must be an object")
    return value


def _flag(params: Mapping[str, object], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise _invalid(f"'{key}' must be true or false")
    return value


def _utf8(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise _invalid(f"{INPUT}'s strings must be UTF-8") from None


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message)


__all__ = ["InferRequest", "decode_bytes", "decode_request", "encode_answer", "encode_bytes"]
