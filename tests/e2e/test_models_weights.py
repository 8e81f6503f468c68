"""A canary by weights, end to end: 90/10 between two versions of one model, the choice
pinned by the request's Idempotency-Key (a hash of it, the same whatever the server kept).

One server for the module: the first test wants its canary as the server starts it (cold:
only defaults are placed), the second warms it first whatever the first did.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator

import anyio
import pytest

from loadtest.models_rollout import Request, Shot, send_all
from loadtest.server import RunningServer, running_server
from tests.e2e.test_models import (
    KEYS,
    PAID,
    PATIENT,
    V1,
    V2,
    ask,
    catalogue,
    expected,
    version_of,
    wait_models,
)
from tests.e2e.test_models import gateways as gateways  # one process here

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
REQUESTS = 2000
KEPT = 400  # --idempotency-max-entries: an account keeps a quarter, its newest 100
WEIGHTED = f"""
[models.w]
default = "v1"
weights = {{ v1 = 90, v2 = 10 }}
[models.w.versions.v1]
spec = "{V1}"
load_s = 1
[models.w.versions.v2]
spec = "{V2}"
load_s = 1
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = [*KEYS, *catalogue(tmp_path_factory.mktemp("weights"), WEIGHTED),
            "--idempotency-max-entries", str(KEPT)]
    with running_server(workers=2, args=args) as srv:
        yield srv


def share(shots: list[Shot], model: str) -> float:
    return sum(s.model == model for s in shots) / len(shots)


async def test_a_canarys_first_requests_are_answered_or_refused_never_timed_out(
    server: RunningServer,
) -> None:
    """Right after the start the canary holds no worker (only defaults are placed): a
    request drawn for it waits for its load or is refused 503 model_loading with a
    Retry-After, as admission's ETA says; it never times out waiting for a load that
    admission said would come in time."""
    requests: list[Request] = [({"input": f"C-{i}", "model": "w"}, PAID) for i in range(200)]
    shots = await send_all(server.url, requests, concurrency=20)
    refused = [s for s in shots if s.status != 200]
    assert all(s.output == expected(s.model or "", f"C-{s.index}") for s in shots
               if s.status == 200)
    assert 0 < len(refused) + sum(s.model == "w@v2" for s in shots) < 60  # about a tenth
    for s in refused:
        assert (s.status, s.error_code) == (503, "model_loading"), s
        assert int(s.headers["retry-after"]) >= 1


async def test_weights_split_2000_requests_90_10_and_a_key_keeps_its_version(
    server: RunningServer,
) -> None:
    with anyio.fail_after(60):  # the canary loaded (a request naming it waits for its load)
        while (await ask(server.url, "w@v2", headers=PATIENT)).status_code != 200:  # noqa: ASYNC110
            await anyio.sleep(0.5)  # another process: refused while it loads, ask again
    await wait_models(server.url, lambda v: all(
        version_of(v, "w", x)["resident_workers"] >= 1 for x in ("v1", "v2")))
    run = secrets.token_hex(4)

    def request(i: int) -> Request:
        """Even ones carry an Idempotency-Key (the pinned choice), odd ones none (a draw)."""
        headers = {**PAID, "Idempotency-Key": f"{run}-{i}"} if i % 2 == 0 else PAID
        return {"input": f"S-{i}", "model": "w"}, headers

    requests = [request(i) for i in range(REQUESTS)]
    shots = await send_all(server.url, requests, concurrency=32)
    assert Counter(s.status for s in shots) == {200: REQUESTS}
    assert all(s.output == expected(s.model or "", f"S-{s.index}") for s in shots)
    assert set(Counter(s.model for s in shots)) == {"w@v1", "w@v2"}
    assert abs(share(shots, "w@v2") - 0.10) <= 0.03
    keyed, drawn = shots[0::2], shots[1::2]
    assert abs(share(keyed, "w@v2") - 0.10) <= 0.05 and abs(share(drawn, "w@v2") - 0.10) <= 0.05

    # The same key, the same version: the newest kept answers are replayed (same id)...
    newest = keyed[-KEPT // 8:]
    replayed = await send_all(server.url, [requests[s.index] for s in newest])
    assert [(r.status, r.body) for r in replayed] == [(200, s.body) for s in newest]
    # ...and the oldest, long evicted from what the account keeps, run again (a new id)
    # on the version their key pins.
    oldest = keyed[:300]
    again = await send_all(server.url, [requests[s.index] for s in oldest])
    assert [r.status for r in again] == [200] * len(oldest)
    assert all(r.body["id"] != s.body["id"] for r, s in zip(again, oldest, strict=True))
    assert [r.model for r in again] == [s.model for s in oldest]
    assert sum(r.model == "w@v2" for r in again) >= 5  # the pin held for the canary's too
