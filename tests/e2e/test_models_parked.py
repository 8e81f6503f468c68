"""A cold model's worker parks, end to end: a model with min_workers = 0 idle past its
idle_unload_s gives its worker up to the model with a floor, and that worker parks (its
process and model kept) instead of exiting; the model's next request wakes it, and once a
wake is measured the door expects the next one to take a wake's time, not a load's: a
deadline far shorter than the load is met."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadtest.server import RunningServer, running_server
from tests.e2e.test_models import KEYS, PATIENT, V1, ask, catalogue, version_of, wait_models
from tests.e2e.test_models import gateways as gateways  # one process here
from tests.e2e.test_models_cold import HURRIED, IDLE_UNLOAD_S, SLOW_V2, UNLOAD_WITHIN_S
from tests.models_versions import v2

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PARKED = f"""
[models.a]
[models.a.versions.v1]
spec = "{V1}"
[models.c]
min_workers = 0
idle_unload_s = {IDLE_UNLOAD_S}
[models.c.versions.v1]
spec = "{SLOW_V2}"  # answers as v2 does, after a load of a second
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = [*KEYS, *catalogue(tmp_path_factory.mktemp("parked"), PARKED), "--parked-max", "2"]
    with running_server(workers=2, args=args) as srv:
        yield srv


async def parked(server: RunningServer) -> dict[str, object]:
    """Once `c` is cold, its worker parked: c's row of /admin/models."""
    view = await wait_models(server.url, lambda v: version_of(v, "c", "v1")["state"] == "cold"
                             and version_of(v, "c", "v1")["start"] == "wake",
                             within=UNLOAD_WITHIN_S)
    return version_of(view, "c", "v1")


async def test_a_cold_models_worker_parks_and_its_requests_wake_it(
        server: RunningServer) -> None:
    before = await parked(server)
    assert "wake" not in before["start_s"]  # type: ignore[operator]
    r = await ask(server.url, "c", text="wake", headers=PATIENT)
    assert r.status_code == 200 and r.json()["output"] == v2(["wake"])[0], r.text
    again = await parked(server)  # woken, served, idle, parked again
    starts = again["start_s"]
    assert isinstance(starts, dict) and "wake" in starts
    assert again["load_s"] == starts["wake"]  # what the door expects now: a wake
    hurried = await ask(server.url, "c", text="soon", headers=HURRIED)
    assert hurried.status_code == 200, hurried.text  # not 503 model_loading: a wake fits
