"""`ModelInfer`'s tensors as batchgate reads and writes them (`api.oip.grpc_codec`): both of
the protocol's encodings of a BYTES tensor, every malformed shape refused with a message, and
the gRPC status of each of the door's refusals."""

from __future__ import annotations

import grpc
import pytest

from api.errors import ERRORS, ApiError
from api.oip import Inferred
from api.oip.grpc import grpc_predict_v2_pb2 as pb
from api.oip.grpc_codec import Decoded, decode, encode, raw_bytes, status_code, trailers
from api.oip.grpc_server import _metadata, _timeout_ms

TEXTS = ["abc", "héllo", ""]


def request(texts: list[str] = TEXTS, raw: bool = True, shape: list[int] | None = None,
            datatype: str = "BYTES") -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="default")
    tensor = r.inputs.add(name="INPUT", datatype=datatype,
                          shape=[len(texts)] if shape is None else shape)
    elements = [t.encode() for t in texts]
    if raw:
        r.raw_input_contents.append(raw_bytes(elements))
    else:
        tensor.contents.bytes_contents.extend(elements)
    return r


def refusal(r: pb.ModelInferRequest) -> ApiError:
    with pytest.raises(ApiError) as caught:
        decode(r)
    assert status_code(caught.value.status) == grpc.StatusCode.INVALID_ARGUMENT
    return caught.value


def test_raw_elements_are_four_byte_little_endian_lengths_and_their_bytes() -> None:
    assert raw_bytes([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert decode(request(raw=True)) == Decoded(TEXTS, True, ())


def test_bytes_contents_decode_to_the_same_strings() -> None:
    assert decode(request(raw=False)) == Decoded(TEXTS, False, ())


def test_a_column_of_shape_n_by_1_is_taken() -> None:
    assert decode(request(shape=[3, 1])).texts == TEXTS


@pytest.mark.parametrize("shape", [[2], [4], [3, 2], [1, 3, 1], [], [-1]])
def test_a_shape_that_does_not_hold_the_elements_is_refused(shape: list[int]) -> None:
    assert "shape" in refusal(request(shape=shape)).message


@pytest.mark.parametrize("raw", [b"\x05\x00\x00\x00ab", b"\x02\x00", b"\x01\x00\x00\x00\xff"])
def test_truncated_or_non_utf8_raw_contents_are_refused(raw: bytes) -> None:
    r = pb.ModelInferRequest(model_name="default", raw_input_contents=[raw])
    r.inputs.add(name="INPUT", datatype="BYTES", shape=[1])
    message = refusal(r).message
    assert "ends inside" in message or "UTF-8" in message


def test_other_datatypes_two_inputs_and_both_encodings_at_once_are_refused() -> None:
    assert "BYTES" in refusal(request(datatype="FP32")).message
    two = request()
    two.inputs.add(name="OTHER", datatype="BYTES", shape=[1])
    assert "one input" in refusal(two).message
    both = request(raw=True)
    both.inputs[0].contents.bytes_contents.append(b"x")
    assert "both" in refusal(both).message


def test_an_unknown_requested_output_is_refused() -> None:
    r = request()
    r.outputs.add(name="PROBS")
    assert "PROBS" in refusal(r).message


def inferred(refused: list[str] | None = None) -> Inferred:
    return Inferred("id", ["cba", "", "x"], refused or [], "default", "v1")


def test_the_answer_comes_back_raw_when_the_request_came_raw() -> None:
    response = encode(inferred(), decode(request(raw=True)), request())
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT", "BYTES", [3])]
    assert list(response.raw_output_contents) == [raw_bytes([b"cba", b"", b"x"])]
    assert (response.model_name, response.model_version) == ("default", "v1")


def test_the_answer_comes_back_in_contents_otherwise_with_refused_beside_it() -> None:
    answer = inferred(["", "safety:marker", ""])
    response = encode(answer, decode(request(raw=False)), request(raw=False))
    assert not response.raw_output_contents
    assert {o.name: list(o.contents.bytes_contents) for o in response.outputs} == {
        "OUTPUT": [b"cba", b"", b"x"], "REFUSED": [b"", b"safety:marker", b""]}


def test_only_the_outputs_asked_for_are_answered() -> None:
    r = request()
    r.outputs.add(name="REFUSED")
    response = encode(inferred(["", "g:r", ""]), decode(r), r)
    assert [o.name for o in response.outputs] == ["REFUSED"]
    assert list(response.raw_output_contents) == [raw_bytes([b"", b"g:r", b""])]


@pytest.mark.parametrize(("status", "code"), [
    (400, grpc.StatusCode.INVALID_ARGUMENT), (413, grpc.StatusCode.INVALID_ARGUMENT),
    (422, grpc.StatusCode.INVALID_ARGUMENT), (401, grpc.StatusCode.UNAUTHENTICATED),
    (403, grpc.StatusCode.PERMISSION_DENIED), (404, grpc.StatusCode.NOT_FOUND),
    (409, grpc.StatusCode.FAILED_PRECONDITION), (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (499, grpc.StatusCode.CANCELLED), (503, grpc.StatusCode.UNAVAILABLE),
    (504, grpc.StatusCode.DEADLINE_EXCEEDED), (500, grpc.StatusCode.INTERNAL),
])
def test_each_http_status_has_its_grpc_status(status: int, code: grpc.StatusCode) -> None:
    assert status_code(status) == code


def test_every_error_code_maps_to_a_status_other_than_ok() -> None:
    assert all(status_code(e.status) != grpc.StatusCode.OK for e in ERRORS.values())


def test_a_refusal_says_its_code_and_when_to_retry_in_its_trailers() -> None:
    assert dict(trailers(ApiError("queue_full", "full", {"Retry-After": "3"}))) == {
        "batchgate-error-code": "queue_full", "retry-after": "3"}
    assert dict(trailers(ApiError("unauthorized", "who"))) == {
        "batchgate-error-code": "unauthorized"}


def test_the_timeout_parameter_is_microseconds_and_zero_means_none() -> None:
    r = request()
    assert _timeout_ms(r) is None
    r.parameters["timeout"].int64_param = 2_500_000
    assert _timeout_ms(r) == "2500.0"
    r.parameters["timeout"].int64_param = 0
    assert _timeout_ms(r) is None
    r.parameters["timeout"].bool_param = True
    with pytest.raises(ApiError):
        _timeout_ms(r)


def test_the_generated_messages_live_beside_tritonclients_own() -> None:
    """Both register `inference.*`: batchgate's in a pool of its own, or one process could
    not import tritonclient.grpc and the server together."""
    from tritonclient.grpc import service_pb2

    ours = request()
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert list(theirs.raw_input_contents) == list(ours.raw_input_contents)
    assert decode(pb.ModelInferRequest.FromString(theirs.SerializeToString())).texts == TEXTS


class _Context:
    """The metadata a gRPC call brought, as `grpc.aio` hands it over."""

    def __init__(self, *pairs: tuple[str, str], left: float | None = None) -> None:
        self.pairs, self.left = pairs, left

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.pairs

    def time_remaining(self) -> float | None:
        return self.left


def test_the_metadata_infer_reads_include_a_callers_traceparent() -> None:
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    got = _metadata(_Context(("authorization", "Bearer k"), ("traceparent", header),
                             ("user-agent", "grpc-python")))  # type: ignore[arg-type]
    assert got == {"authorization": "Bearer k", "traceparent": header}


def test_a_calls_deadline_is_its_timeout_unless_the_metadata_names_one() -> None:
    auth = ("authorization", "Bearer k")
    assert _metadata(_Context(auth, left=2.5))["x-request-timeout-ms"] == "2500.000"  # type: ignore[arg-type]
    assert _metadata(_Context(auth, left=0.0))["x-request-timeout-ms"] == "1.000"  # type: ignore[arg-type]
    assert "x-request-timeout-ms" not in _metadata(_Context(auth))  # type: ignore[arg-type]
    named = _Context(auth, ("x-request-timeout-ms", "900"), left=2.5)
    assert _metadata(named)["x-request-timeout-ms"] == "900"  # type: ignore[arg-type]
