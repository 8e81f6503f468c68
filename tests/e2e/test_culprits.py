"""The guilty and the innocent, on real server processes: a culprit that leaves mid-batch
must not get the batch-mates it leaves behind blamed."""

from __future__ import annotations

import anyio
import httpx
import pytest

from loadtest.server import running_server
from tests.e2e.helpers import EXAMPLE_KEYS

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PAID = {"Authorization": "Bearer paid-demo-key"}
LEAVES = {"X-Request-Timeout-Ms": "120"}  # gone while its batch (0.3 s) still runs


async def test_a_poison_that_leaves_mid_batch_gets_no_innocent_blamed() -> None:
    # One worker, a 100 ms wait: the two requests ride in one batch that the poison fails
    # after 0.3 s, when its own request has timed out.
    args = ["--keys", str(EXAMPLE_KEYS), "--model", "tests.models:slow_poison",
            "--max-wait-ms", "100"]
    with running_server(workers=1, args=args) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            got: dict[str, httpx.Response] = {}

            async def post(name: str, text: str, headers: dict[str, str]) -> None:
                got[name] = await client.post("/v1/batchstring", json={"input": text},
                                              headers=headers)

            for attempt in range(3):
                got.clear()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(post, "innocent", f"innocent-{attempt}", PAID)
                    tg.start_soon(post, "poison", f"POISON-{attempt}", LEAVES)
                assert got["poison"].status_code == 504, got["poison"].text
                assert got["innocent"].status_code == 200, got["innocent"].text
                assert got["innocent"].json()["output"] == f"innocent-{attempt}"[::-1]
