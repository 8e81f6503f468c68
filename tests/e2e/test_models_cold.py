"""Cold models, end to end: a model with min_workers = 0 idle past its idle_unload_s is
unloaded (its worker goes to the model that has a floor), and its next request waits for
the load, or is refused 503 model_loading with a Retry-After when its deadline cannot fit
the load.

One server for the module, whose tests run in order: `c` and `d` both go cold once idle
(after a worker's minimum residency, `failover.fleet.placement.PlacementSettings`), then
each of the next tests has a cold model of its own without waiting for a second unload.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from loadtest.server import RunningServer, running_server
from tests.e2e.test_models import (
    KEYS,
    PAID,
    PATIENT,
    V1,
    ask,
    catalogue,
    version_of,
    wait_models,
    workers_holding,
)
from tests.e2e.test_models import gateways as gateways  # one process here
from tests.models_versions import v2

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
IDLE_UNLOAD_S = 2
SLOW_V2 = "tests.models_slow_load:v2"  # v2's answers after a load of a second
HURRIED_S = 0.3  # a deadline shorter than that load
HURRIED = {**PAID, "X-Request-Timeout-Ms": str(int(HURRIED_S * 1000))}
UNLOAD_WITHIN_S = 90.0  # the minimum residency (10 s) and idle_unload_s: a bound, with
# room for a busy machine (a quiet one unloads both within about 15 s)
COLD = f"""
[models.a]
[models.a.versions.v1]
spec = "{V1}"
load_s = 1
""" + "".join(f"""
[models.{name}]
min_workers = 0
idle_unload_s = {IDLE_UNLOAD_S}
[models.{name}.versions.v1]
spec = "{SLOW_V2}"  # answers as v2 does
load_s = 1
""" for name in ("c", "d"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Nothing parks: a cold model's worker exits, and its next load is a start (a parked
    # one wakes in milliseconds: tests/e2e/test_models_parked.py).
    args = [*KEYS, *catalogue(tmp_path_factory.mktemp("cold"), COLD), "--parked-max", "0"]
    with running_server(workers=3, args=args) as srv:
        yield srv


async def unloaded(server: RunningServer, model: str) -> None:
    """Wait until `model` has gone cold and its worker has joined `a`."""
    view = await wait_models(server.url, lambda v: version_of(v, model, "v1")[
        "state"] == "cold" and version_of(v, "a", "v1")["resident_workers"] >= 2,
        within=UNLOAD_WITHIN_S)
    assert version_of(view, model, "v1")["resident_workers"] == 0
    assert f"{model}@v1" not in await workers_holding(server.url)


async def refused_while_cold(server: RunningServer, model: str) -> int:
    """A request whose deadline cannot fit the load: 503 model_loading; its Retry-After."""
    r = await ask(server.url, model, headers=HURRIED)
    assert (r.status_code, r.json()["error"]["code"]) == (503, "model_loading"), r.text
    retry_after = int(r.headers["retry-after"])
    assert retry_after >= 1
    return retry_after


async def test_idle_models_are_unloaded_to_the_model_with_a_floor_not_to_each_other(
    server: RunningServer,
) -> None:
    """Nobody asks for c or d: both are unloaded, their workers go to a, and neither is
    ever loaded again meanwhile (an idle worker moved onto the other idle model is a load
    that serves nothing, and is unloaded again a residency later)."""
    assert await workers_holding(server.url) == {"a@v1": 1, "c@v1": 1, "d@v1": 1}
    first = await wait_models(server.url, lambda v: all(  # their first loads, measured
        version_of(v, m, "v1")["load_s"] is not None for m in ("c", "d")))
    view = await wait_models(server.url, lambda v: all(
        version_of(v, m, "v1")["state"] == "cold" for m in ("c", "d")), within=UNLOAD_WITHIN_S)
    assert [version_of(view, m, "v1")["load_s"] for m in ("c", "d")] == [
        version_of(first, m, "v1")["load_s"] for m in ("c", "d")]  # no load since
    await wait_models(server.url, lambda v: version_of(v, "a", "v1")["resident_workers"] == 3)
    assert await workers_holding(server.url) == {"a@v1": 3}


async def test_an_idle_model_is_unloaded_and_its_next_request_waits_for_the_load(
    server: RunningServer,
) -> None:
    await unloaded(server, "c")
    await refused_while_cold(server, "c")
    started = time.monotonic()
    r = await ask(server.url, "c", text="wait", headers=PATIENT)
    waited = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert r.json() | {"id": ""} == {"id": "", "output": v2(["wait"])[0], "model": "c@v1"}
    assert waited > HURRIED_S  # longer than the refused deadline: it waited for the load
    view = await wait_models(server.url, lambda v: version_of(v, "c", "v1")[
        "state"] == "resident")
    assert version_of(view, "c", "v1")["load_s"] is not None  # loaded by a switch
    assert (await ask(server.url, "c", headers=HURRIED)).status_code == 200  # warm now


async def test_a_refused_request_starts_the_load_its_retry_after_points_to(
    server: RunningServer,
) -> None:
    """The refusal is the request for the model: with no other request, the model is
    loaded (once a worker may leave its version), and a retry with the same deadline is
    answered."""
    await unloaded(server, "d")
    await refused_while_cold(server, "d")
    await wait_models(server.url, lambda v: version_of(v, "d", "v1")["state"] == "resident",
                      within=45.0)  # a bound: a quiet machine loads it within a few seconds
    r = await ask(server.url, "d", text="retry", headers=HURRIED)
    assert r.status_code == 200, r.text
    assert r.json()["output"] == v2(["retry"])[0]
