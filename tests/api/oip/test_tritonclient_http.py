"""An unmodified `tritonclient.http` against a real server serving a catalogue of models, in
one process and in a cell of two gateways: health, readiness, metadata, infer in binary and
in JSON, through the same door as `/v1` (keys and tiers, limits, Idempotency-Key, deadlines,
models and versions), its refusals raised as tritonclient's own exception with the status."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from loadtest.server import RunningServer, running_server
from tests.e2e.helpers import EXAMPLE_KEYS

pytestmark = pytest.mark.e2e
PAID = {"Authorization": "Bearer paid-demo-key"}
FREE = {"Authorization": "Bearer free-demo-key"}
# tritonclient writes Inference-Header-Content-Length into the `headers` it is given: each
# call gets a copy (`dict(PAID)`), or the next one would send a stale length.
# "words": the sim model (each input reversed); "marks" at v2: each upper-cased, marked.
MODELS = """
[models.words]
[models.words.versions.v1]
spec = "sim"

[models.marks]
[models.marks.versions.v2]
spec = "tests.models_versions:v2"
"""


def keys_file(tmp: Path) -> Path:
    """The example keys, budgets no test load reaches; the free tier allowed one request
    (a burst of one, then one a quarter hour), so that its second is refused for its tier."""
    text = EXAMPLE_KEYS.read_text().replace("budget_ms = 400", "budget_ms = 60000") \
        .replace("budget_ms = 250", "budget_ms = 60000") \
        .replace("rate = 1500\nburst = 3000", "rate = 0.001\nburst = 1")
    assert "rate = 0.001" in text
    path = tmp / "keys.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module", params=[1, 2], ids=["gateways=1", "gateways=2"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("oip")
    (tmp / "models.toml").write_text(MODELS)
    args = ["--keys", str(keys_file(tmp)), "--models", str(tmp / "models.toml"),
            "--gateways", str(request.param)]
    with running_server(workers=2, args=args) as srv:
        yield srv


@pytest.fixture
def client(live: RunningServer) -> Iterator[th.InferenceServerClient]:
    with th.InferenceServerClient(live.url.removeprefix("http://"), network_timeout=30) as c:
        yield c


def strings(texts: list[str], binary: bool = True) -> th.InferInput:
    tensor = th.InferInput("INPUT", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object),
                               binary_data=binary)
    return tensor


def outputs(result: th.InferResult, name: str = "OUTPUT") -> list[str]:
    return [o.decode() if isinstance(o, bytes) else o for o in result.as_numpy(name)]


def refusal(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def test_health_readiness_and_metadata(client: th.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("words") and client.is_model_ready("marks", "v2")
    assert not client.is_model_ready("marks", "v1") and not client.is_model_ready("nope")
    server = client.get_server_metadata()
    assert server["name"] == "batchgate" and "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata("marks")
    assert meta["name"] == "marks" and meta["versions"] == ["v2"]
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "OUTPUT", "datatype": "BYTES", "shape": [-1]}]
    assert client.get_model_metadata("words", "v1")["versions"] == ["v1"]
    assert refusal(client.get_model_metadata, "nope").status() == "404"
    assert refusal(client.get_model_metadata, "words", "v7").status() == "404"


def test_binary_infer_answers_every_string_in_order(client: th.InferenceServerClient) -> None:
    texts = ["The striker scored", "héllo wörld", "", "x" * 300]
    result = client.infer("words", [strings(texts)], headers=dict(PAID))
    assert outputs(result) == [t[::-1] for t in texts]
    answer = result.get_response()
    assert (answer["model_name"], answer["model_version"]) == ("words", "v1")
    assert answer["outputs"][0]["parameters"]["binary_data_size"] > 0  # it came as binary


def test_json_infer_with_an_id_a_version_and_a_deadline(
    client: th.InferenceServerClient,
) -> None:
    result = client.infer("marks", [strings(["ab", "cd"], binary=False)], model_version="v2",
                          outputs=[th.InferRequestedOutput("OUTPUT", binary_data=False)],
                          request_id="req-1", timeout=20_000_000, headers=dict(PAID))
    assert outputs(result) == ["v2:AB", "v2:CD"]
    answer = result.get_response()
    assert answer["id"] == "req-1" and answer["outputs"][0]["data"] == ["v2:AB", "v2:CD"]


def test_a_deadline_too_short_is_the_doors_refusal(client: th.InferenceServerClient) -> None:
    late = refusal(client.infer, "words", [strings(["slow"])], timeout=1000, headers=dict(PAID))
    assert late.status() in ("503", "504")  # refused at admission, or out of time


def test_unknown_models_and_versions_are_refused(client: th.InferenceServerClient) -> None:
    for name, version in [("nope", ""), ("marks", "v1"), ("words", "v9")]:
        err = refusal(client.infer, name, [strings(["a"])], model_version=version,
                      headers=dict(PAID))
        assert err.status() == "422" and "model" in err.message()


def test_keys_and_limits_are_the_doors(client: th.InferenceServerClient) -> None:
    unknown = refusal(client.infer, "words", [strings(["a"])],
                      headers={"Authorization": "Bearer no-such-key"})
    assert (unknown.status(), unknown.message()) == ("401", "unknown API key")
    many = refusal(client.infer, "words", [strings(["a"] * 101)], headers=dict(PAID))
    assert many.status() == "422"
    assert outputs(client.infer("words", [strings(["anonymous"])])) == ["suomynona"]


def test_the_free_tier_is_held_to_its_rate_and_the_paid_one_is_not(
    client: th.InferenceServerClient, live: RunningServer,
) -> None:
    assert outputs(client.infer("words", [strings(["free"])], headers=dict(FREE))) == ["eerf"]
    limited = refusal(client.infer, "words", [strings(["again"])], headers=dict(FREE))
    assert limited.status() == "429"
    for _ in range(3):
        assert outputs(client.infer("words", [strings(["paid"])], headers=dict(PAID))) == ["diap"]
    raw = httpx.post(f"{live.url}/v2/models/words/infer", headers=dict(FREE), json={
        "inputs": [{"name": "INPUT", "shape": [1], "datatype": "BYTES", "data": ["x"]}]})
    assert raw.status_code == 429 and raw.headers["Retry-After"].isdigit()
    assert raw.json()["code"] == "rate_limited"


def test_an_idempotency_key_replays_the_same_answer(client: th.InferenceServerClient) -> None:
    keyed = {**PAID, "Idempotency-Key": "oip-replay-1"}
    first = client.infer("words", [strings(["once", "only"])], headers=dict(keyed))
    again = client.infer("words", [strings(["once", "only"])], headers=dict(keyed))
    assert first.get_response()["id"] == again.get_response()["id"]
    assert outputs(first) == outputs(again) == ["ecno", "ylno"]
    other = refusal(client.infer, "words", [strings(["other"])], headers=dict(keyed))
    assert other.status() == "422" and "idempotency key" in other.message()


def test_every_gateway_serves_the_protocol(live: RunningServer) -> None:
    """Connections pinned to each gateway (its /healthz says which): each one infers."""
    body, length = th.InferenceServerClient.generate_request_body([strings(["gw", "ok"])])
    with ExitStack() as stack:
        seen: dict[object, httpx.Client] = {}
        for _ in range(64):
            one = stack.enter_context(httpx.Client(
                base_url=live.url, timeout=30, limits=httpx.Limits(max_connections=1)))
            seen.setdefault(one.get("/healthz").json().get("gateway"), one)
            if len(seen) == (2 if None not in seen else 1):
                break
        assert len(seen) == (1 if None in seen else 2)
        for one in seen.values():
            r = one.post("/v2/models/words/infer", content=body, headers={
                **PAID, "Inference-Header-Content-Length": str(length),
                "Content-Type": "application/octet-stream"})
            assert r.status_code == 200, r.text
            result = th.InferenceServerClient.parse_response_body(
                r.content, header_length=int(r.headers["Inference-Header-Content-Length"]))
            assert outputs(result) == ["wg", "ko"]


def test_malformed_bodies_are_400_in_the_protocols_shape(live: RunningServer) -> None:
    for body, headers in [(b"{", {}), (b'{"inputs": []}', {}),
                          (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"})]:
        r = httpx.post(f"{live.url}/v2/models/words/infer", content=body,
                       headers={**PAID, **headers})
        assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
