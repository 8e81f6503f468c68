"""`--grpc-port` end to end: unmodified `tritonclient.grpc` (and Triton's own, larger proto)
against a real server, in one process and in a cell of two gateways sharing the port."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from loadtest.server import RunningServer, fetch_metrics, free_port, metric, running_server
from tests.e2e.helpers import EXAMPLE_KEYS
from tests.e2e.test_cell import until

pytestmark = pytest.mark.e2e
PAID = {"authorization": "Bearer paid-demo-key"}
FREE = {"authorization": "Bearer free-demo-key"}
CATALOGUE = """
[models.topics]
default = "v1"
pre = ["safety"]
[models.topics.versions.v1]
spec = "tests.models_versions:v1"
load_s = 1
[models.marks]
default = "v2"
[models.marks.versions.v2]
spec = "tests.models_versions:v2"
load_s = 1
[models.safety.versions.v1]
spec = "tests.models_guards:refuse_marker"
"""


@dataclass(frozen=True, slots=True)
class Served:
    server: RunningServer
    address: str  # host:port of the gRPC service
    client: triton.InferenceServerClient


@contextmanager
def serving(args: list[str], workers: int = 1) -> Iterator[Served]:
    port = free_port()
    with running_server(workers, "sim", ["--keys", str(EXAMPLE_KEYS), "--grpc-port",
                                         str(port), *args]) as srv:
        address = f"127.0.0.1:{port}"
        client = triton.InferenceServerClient(address)
        try:
            yield Served(srv, address, client)
        finally:
            client.close()


@pytest.fixture(scope="module", params=[[], ["--gateways", "2"]], ids=["process", "cell"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    with serving(request.param) as s:
        yield s


def strings(*texts: str, name: str = "INPUT") -> triton.InferInput:
    tensor = triton.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def outputs(result: triton.InferResult, name: str = "OUTPUT") -> list[str]:
    return [b.decode() for b in result.as_numpy(name)]


def refused(call: object) -> InferenceServerException:
    assert callable(call)
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_health_and_metadata(served: Served) -> None:
    c = served.client
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("default") and c.is_model_ready("default", "v1")
    assert not c.is_model_ready("nope")
    assert c.get_server_metadata(as_json=True)["name"] == "batchgate"
    meta = c.get_model_metadata("default", as_json=True)
    assert (meta["name"], meta["versions"]) == ("default", ["v1"])
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT", "BYTES", ["-1"])]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT", "REFUSED"]
    missing = refused(lambda: c.get_model_metadata("nope"))
    assert missing.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("headers", [PAID, FREE], ids=["paid", "free"])
def test_several_strings_per_call_come_back_reversed_and_in_order(
        served: Served, headers: dict[str, str]) -> None:
    texts = [f"{uuid.uuid4().hex[:8]}-{i}" for i in range(7)] + ["héllo", ""]
    result = served.client.infer("default", [strings(*texts)], headers=headers)
    assert outputs(result) == [t[::-1] for t in texts]
    assert result.get_output("REFUSED") is None
    assert result.get_response().model_version == "v1"


def test_tritons_own_proto_sends_bytes_contents_and_gets_contents_back(served: Served) -> None:
    request = service_pb2.ModelInferRequest(model_name="default", id="r-1")
    tensor = request.inputs.add(name="INPUT", datatype="BYTES", shape=[2, 1])
    tensor.contents.bytes_contents.extend([b"ab", b"cde"])
    with grpc.insecure_channel(served.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, metadata=list(PAID.items()), timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, metadata=[("authorization", "Bearer nope")], timeout=30)
    assert response.id == "r-1" and not response.raw_output_contents
    assert list(response.outputs[0].contents.bytes_contents) == [b"ba", b"edc"]
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("batchgate-error-code", "unauthorized") in caught.value.trailing_metadata()


def test_refusals_are_tritonclients_own_exceptions_with_their_status(served: Served) -> None:
    c = served.client
    unknown = refused(lambda: c.infer("default", [strings("a")],
                                      headers={"authorization": "Bearer nope"}))
    assert unknown.status() == "StatusCode.UNAUTHENTICATED"
    many = refused(lambda: c.infer("default", [strings(*["x"] * 101)], headers=PAID))
    assert many.status() == "StatusCode.INVALID_ARGUMENT" and "1..100" in many.message()
    model = refused(lambda: c.infer("nope", [strings("a")], headers=PAID))
    assert model.status() == "StatusCode.INVALID_ARGUMENT" and "nope" in model.message()
    instant = refused(lambda: c.infer("default", [strings("a")], headers=PAID, timeout=1))
    assert instant.status() == "StatusCode.INVALID_ARGUMENT"


def test_an_idempotency_key_replays_the_same_answer(served: Served) -> None:
    headers = {**PAID, "idempotency-key": f"k-{uuid.uuid4()}"}
    before = metric(fetch_metrics(served.server.url), "batchgate_idempotent_replays_total")
    first = served.client.infer("default", [strings("one", "two")], headers=headers)
    again = served.client.infer("default", [strings("one", "two")], headers=headers)
    assert outputs(first) == outputs(again) == ["eno", "owt"]
    after = metric(fetch_metrics(served.server.url), "batchgate_idempotent_replays_total")
    assert after == before + 1
    other = refused(lambda: served.client.infer("default", [strings("three")],
                                                headers=headers))
    assert other.status() == "StatusCode.INVALID_ARGUMENT"
    assert "idempotency key" in other.message()


def test_a_catalogues_version_by_name_and_a_guards_refusal(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text(CATALOGUE)
    with serving(["--models", str(models)], workers=3) as s:
        meta = s.client.get_model_metadata("marks", as_json=True)
        assert meta["versions"] == ["v2"]
        patient = {**PAID, "x-request-timeout-ms": "30000"}
        v2 = s.client.infer("marks", [strings("ab", "cd")], model_version="v2",
                            headers=patient)
        assert outputs(v2) == ["v2:AB", "v2:CD"] and v2.get_response().model_version == "v2"
        guarded = s.client.infer("topics", [strings("ab", "BLOCKME x")], model_version="v1",
                                 headers=patient)
        assert outputs(guarded) == ["v1:ba", ""]
        assert outputs(guarded, "REFUSED") == ["", "safety:marker"]
        alone = refused(lambda: s.client.infer("topics", [strings("BLOCKME")],
                                               headers=patient))
        assert alone.status() == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize("cell", [[], ["--gateways", "2"]], ids=["process", "cell"])
def test_a_calls_deadline_is_the_doors_and_a_client_that_leaves_is_withdrawn(
        cell: list[str]) -> None:
    with serving(["--batch-latency-ms", "1000", *cell]) as s:
        # Its gRPC deadline is the door's: a batch takes 1 s, so two inputs due in 0.3 s are
        # refused at once (a deadline the door could not see would end at the client, in
        # DEADLINE_EXCEEDED without the door's code).
        request = service_pb2.ModelInferRequest(model_name="default")
        request.inputs.add(name="INPUT", datatype="BYTES", shape=[2]).contents \
            .bytes_contents.extend([b"late", b"later"])
        with grpc.insecure_channel(s.address) as channel, \
                pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, metadata=list(PAID.items()), timeout=0.3)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
        assert ("batchgate-error-code", "deadline_unreachable") in \
            caught.value.trailing_metadata()
        # With X-Request-Timeout-Ms the door waits that long; the client leaves before.
        gone = refused(lambda: s.client.infer(
            "default", [strings("gone")], headers={**PAID, "x-request-timeout-ms": "30000"},
            client_timeout=0.3))
        assert gone.status() == "StatusCode.DEADLINE_EXCEEDED"
        after = s.client.infer("default", [strings("after")], headers=PAID)
        assert outputs(after) == ["retfa"]
        assert s.server.process.poll() is None


def test_a_call_in_flight_when_the_server_drains_is_answered() -> None:
    with serving(["--batch-latency-ms", "2000"]) as s:
        answered: list[list[str]] = []

        def call() -> None:
            result = s.client.infer("default", [strings("slow")], headers=PAID)
            answered.append(outputs(result))

        caller = threading.Thread(target=call)
        caller.start()
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(until, s.server.url, a_worker_is_busy)
        s.server.process.send_signal(signal.SIGTERM)
        caller.join(timeout=30)
        assert s.server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert answered == [["wols"]]


def a_worker_is_busy(samples: dict[str, float]) -> bool:
    return metric(samples, "batchgate_workers", state="busy") >= 1
