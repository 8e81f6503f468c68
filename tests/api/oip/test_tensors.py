"""An infer request's body read into strings, and the answer written back, as tritonclient
itself writes and reads them (its own `generate_request_body` and `parse_response_body`):
JSON and the binary tensor data extension, and every malformed body a 400."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as th
from hypothesis import given
from hypothesis import strategies as st

from api.errors import ApiError
from api.oip import Inferred, InferRequest, decode_request, encode_answer
from api.oip.tensors import decode_bytes, encode_bytes

TEXTS = st.lists(st.text(max_size=20), min_size=1, max_size=100)


def triton_body(texts: list[str], binary: bool = True, **kwargs: Any
                ) -> tuple[bytes, str | None]:
    """The body tritonclient sends for `texts`, and its Inference-Header-Content-Length."""
    tensor = th.InferInput("INPUT", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object),
                               binary_data=binary)
    body, length = th.InferenceServerClient.generate_request_body([tensor], **kwargs)
    return body, None if length is None else str(length)


def answer(outputs: list[str], refused: list[str] | None = None) -> Inferred:
    return Inferred("a1", outputs, refused or [], "topics", "v2")


def status_of(body: bytes, header_length: str | None = None) -> tuple[int, str]:
    with pytest.raises(ApiError) as info:
        decode_request(body, header_length)
    return info.value.status, info.value.code


def request_json(**fields: Any) -> bytes:
    tensor = {"name": "INPUT", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}
    return orjson.dumps({"inputs": [{**tensor, **fields}]})


@given(TEXTS)
def test_binary_inputs_as_tritonclient_sends_them(texts: list[str]) -> None:
    asked = decode_request(*triton_body(texts))
    assert asked.texts == texts
    assert asked.binary == {"OUTPUT", "REFUSED"}  # no outputs named: all binary


@given(TEXTS)
def test_json_inputs_as_tritonclient_sends_them(texts: list[str]) -> None:
    body, length = triton_body(texts, binary=False)
    assert length is None
    assert decode_request(body, None).texts == texts


def test_id_timeout_and_requested_outputs_are_read() -> None:
    body, length = triton_body(["x"], request_id="r-7", timeout=2_500_000, outputs=[
        th.InferRequestedOutput("OUTPUT", binary_data=False)])
    assert decode_request(body, length) == InferRequest(["x"], "2500.000", "r-7", frozenset())


def test_a_zero_timeout_is_the_default_and_microseconds_keep_their_fraction() -> None:
    body = orjson.loads(request_json())
    body["parameters"] = {"timeout": 0}
    assert decode_request(orjson.dumps(body), None).timeout_ms is None
    body["parameters"] = {"timeout": 1_234_567}
    assert decode_request(orjson.dumps(body), None).timeout_ms == "1234.567"
    body["parameters"] = {"timeout": 1.5e6}  # a whole number, as JSON Schema's integer
    assert decode_request(orjson.dumps(body), None).timeout_ms == "1500.000"


def test_a_shape_of_n_by_one_nested_or_flat() -> None:
    nested = request_json(shape=[2, 1], data=[["a"], ["b"]])
    flat = request_json(shape=[2, 1])
    assert decode_request(nested, None).texts == decode_request(flat, None).texts == ["a", "b"]


@given(TEXTS, st.booleans())
def test_answers_read_back_by_tritonclient(outputs: list[str], binary: bool) -> None:
    asked = InferRequest(["x"] * len(outputs), None, None,
                         frozenset({"OUTPUT", "REFUSED"}) if binary else frozenset())
    body, length = encode_answer(answer(outputs), asked)
    assert (length is not None) == binary
    result = th.InferenceServerClient.parse_response_body(body, header_length=length)
    read = result.as_numpy("OUTPUT")  # bytes from the binary section, str from JSON
    assert [o.decode() if binary else o for o in read] == outputs
    assert result.as_numpy("REFUSED") is None  # no guard refused: no such tensor
    assert result.get_response()["model_name"] == "topics"
    assert result.get_response()["model_version"] == "v2"


def test_refused_inputs_come_in_their_own_tensor_beside_the_outputs() -> None:
    asked = InferRequest(["x", "y"], None, "mine", frozenset({"OUTPUT"}))
    body, length = encode_answer(answer(["ok", ""], ["", "safety:toxic"]), asked)
    result = th.InferenceServerClient.parse_response_body(body, header_length=length)
    assert list(result.as_numpy("OUTPUT")) == [b"ok", b""]
    assert list(result.as_numpy("REFUSED")) == ["", "safety:toxic"]  # JSON: str
    assert result.get_response()["id"] == "mine"


@given(st.lists(st.text(max_size=30), max_size=50))
def test_bytes_tensors_round_trip(values: list[str]) -> None:
    assert decode_bytes(encode_bytes(values), len(values)) == values


@pytest.mark.parametrize("raw", [
    b"\x05\x00\x00\x00abc",  # ends inside the element
    b"\x01\x00",  # ends inside the length
    b"\x01\x00\x00\x00a\x00",  # a byte more than its elements
    b"\x01\x00\x00\x00\xff",  # not UTF-8
    b"\x03\x00\x00\x00\xed\xa0\x80",  # a surrogate, which UTF-8 may not carry
])
def test_malformed_binary_strings_are_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        decode_bytes(raw, 1)
    assert info.value.status == 400


def binary_request(raw: bytes, n: int = 1, size: int | None = None) -> tuple[bytes, str]:
    head = orjson.dumps({"inputs": [{"name": "INPUT", "shape": [n], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)
                                                    if size is None else size}}]})
    return head + raw, str(len(head))


@pytest.mark.parametrize(("body", "length"), [
    (b"", None),
    (b"{", None),
    (b"[]", None),
    (b'{"inputs": []}', None),
    (b'{"inputs": {}}', None),
    (request_json(name=7), None),
    (request_json(datatype="FP32"), None),
    (request_json(shape=[2, 2]), None),
    (request_json(shape=[]), None),
    (request_json(shape=[-1]), None),
    (request_json(shape=["2"]), None),
    (request_json(shape=[True]), None),
    (request_json(shape=[3]), None),  # data and shape disagree
    (request_json(data=["a", 1]), None),
    (request_json(data="ab"), None),
    (request_json(data=None), None),
    (request_json(parameters=[]), None),
    (request_json(parameters={"shared_memory_region": "r"}), None),
    (orjson.dumps({"id": 7, "inputs": orjson.loads(request_json())["inputs"]}), None),
    (orjson.dumps({"parameters": 1, "inputs": orjson.loads(request_json())["inputs"]}), None),
    (request_json() + b"xx", str(len(request_json()))),  # bytes no input claims
    (request_json(), "0"),
    (request_json(), "-3"),
    (request_json(), "9999"),
    (request_json(), "abc"),
    (request_json(), "5"),  # cuts the JSON short
    (*binary_request(b"\x01\x00\x00\x00a", size=4),),  # its size is not the bytes sent
    (*binary_request(b"\x01\x00\x00\x00a", size="5"),),  # type: ignore[arg-type]
    (*binary_request(b"\x01\x00\x00\x00\xff"),),
    (*binary_request(b"\x01\x00\x00\x00a\x01\x00\x00\x00b", n=1),),
    (*binary_request(b"\x01\x00\x00\x00a", n=2),),
    (binary_request(b"\x01\x00\x00\x00a")[0], None),  # binary data without its header
])
def test_every_malformed_body_is_a_400(body: bytes, length: str | None) -> None:
    assert status_of(body, length)[0] == 400


@pytest.mark.parametrize("extra", [
    {"outputs": [{"name": "LOGITS"}]},
    {"outputs": {"name": "OUTPUT"}},
    {"outputs": [{"name": "OUTPUT", "parameters": {"binary_data": "yes"}}]},
    {"outputs": [{"name": "OUTPUT", "parameters": {"shared_memory_region": "r"}}]},
    {"outputs": [{"name": "OUTPUT", "parameters": {"classification": 3}}]},
    {"parameters": {"binary_data_output": 1}},
    {"parameters": {"timeout": "100"}},
    {"parameters": {"timeout": 999}},  # under a millisecond
    {"parameters": {"timeout": 1500000.5}},  # no whole number of microseconds
    {"parameters": {"timeout": True}},
])
def test_malformed_outputs_and_parameters_are_400(extra: dict[str, Any]) -> None:
    body = {**orjson.loads(request_json()), **extra}
    assert status_of(orjson.dumps(body))[0] == 400


def test_a_count_outside_one_to_a_batch_is_the_doors_refusal() -> None:
    assert status_of(request_json(shape=[0], data=[])) == (422, "empty_inputs")
    assert status_of(request_json(shape=[101], data=["a"] * 101)) == (422, "too_many_inputs")


@given(st.binary(max_size=200), st.one_of(st.none(), st.integers(-5, 300).map(str)))
def test_any_bytes_are_read_or_refused_with_a_400(body: bytes, length: str | None) -> None:
    try:
        decode_request(body, length)
    except ApiError as err:
        assert err.status in (400, 422)


def test_the_binary_form_is_a_little_endian_length_then_the_bytes() -> None:
    assert encode_bytes(["hé", ""]) == struct.pack("<I", 3) + "hé".encode() + b"\0\0\0\0"


def test_the_one_input_is_taken_whatever_its_name() -> None:
    """Model metadata says INPUT; a client built for another name (PyTriton's `text`, the
    shared load generator's) is served as the gRPC side serves it."""
    assert decode_request(request_json(name="text"), None).texts == ["a", "b"]
