"""The real server with `sim` workers, over real HTTP."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from api.config import hash_key
from batchgate_client import AsyncClient
from loadtest.server import fetch_metrics, metric, running_server, start_server, stop_server
from tests.e2e.helpers import logged, metric_reaches, post_many

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PAID = {"Authorization": "Bearer paid-demo-key"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}
KEYS = ["--keys", "examples/keys.toml"]


async def test_every_client_gets_its_own_answer_and_batches_form() -> None:
    with running_server(workers=2, args=KEYS) as srv:
        texts = [f"request-{i:04d}-{os.urandom(4).hex()}" for i in range(300)]
        responses = await post_many(srv.url, [{"input": t} for t in texts], PAID)
        assert [r.status_code for r in responses] == [200] * 300
        assert [r.json()["output"] for r in responses] == [t[::-1] for t in texts]
        assert len({r.json()["id"] for r in responses}) == 300
        assert all("queue;dur=" in r.headers["server-timing"] for r in responses)
        m = fetch_metrics(srv.url)
        assert metric(m, "batchgate_batch_size_sum") == 300
        assert metric(m, "batchgate_batch_size_count") < 150  # batches larger than one


async def test_a_request_at_the_size_limits_is_answered_whole(shared_server: str) -> None:
    """100 inputs of 10,000 characters, 1 MB each way: more than any socket buffer on the
    way holds (such a batch was once taken for its worker's death, again and again)."""
    texts = [f"{i:03d}" + "y" * 9_997 for i in range(100)]
    async with httpx.AsyncClient(base_url=shared_server, timeout=30) as client:
        answer = await client.post("/v1/batchstring", json={"inputs": texts}, headers=PAID)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [t[::-1] for t in texts]
    m = fetch_metrics(shared_server)
    assert metric(m, "batchgate_worker_crashes_total") == 0


def test_the_access_log_has_a_line_for_every_answer() -> None:
    with running_server(workers=1, args=[*KEYS, "--access-log", "json"]) as srv:
        ids = [httpx.post(f"{srv.url}/v1/batchstring", json={"input": f"a{i}"}, headers=PAID
                          ).json()["id"] for i in range(4)]  # over both gateways of a cell
        lines = [logged(srv, rid) for rid in ids]
    assert [line["status"] for line in lines] == [200] * 4
    assert all(line["tier"] == "paid" and line["batch_ids"] for line in lines)


async def test_many_inputs_are_collated_in_order() -> None:
    with running_server(workers=2) as srv:
        texts = [f"in-{i}" for i in range(250)]  # three requests of the client's
        async with AsyncClient(srv.url) as client:
            assert await client.batchstring(texts) == [t[::-1] for t in texts]


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"{oops", {}, 400, "malformed_json"),
        (b'{"input": 5}', {}, 400, "invalid_request"),
        (b'{"inputs": []}', {}, 422, "empty_inputs"),
        (b'{"input": "' + b"x" * 10_001 + b'"}', {}, 413, "input_too_large"),
        (b"x" * 2_000_000, {}, 413, "body_too_large"),
        (b'{"input": "a"}', {"Authorization": "Bearer wrong"}, 401, "unauthorized"),
        (b'{"input": "a"}', {"X-Request-Timeout-Ms": "soon"}, 400, "invalid_timeout"),
        # A browser posts these cross-site without a preflight: never served.
        (b'{"input": "a"}', {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        (b"input=a", {"Content-Type": "application/x-www-form-urlencoded"}, 415,
         "unsupported_media_type"),
    ],
    # Short ids: the default one of a 2 MB body went into PYTEST_CURRENT_TEST, and a
    # server started during that test could not be spawned (E2BIG).
    ids=["malformed", "not-a-string", "empty", "long-input", "long-body", "bad-key",
         "bad-timeout", "text-plain", "form"],
)
def test_bad_requests_get_json_errors(
    shared_server: str, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    r = httpx.post(shared_server + "/v1/batchstring", content=body, headers=headers, timeout=30)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code and "Traceback" not in r.text


def test_unknown_paths_and_methods_are_json_too(shared_server: str) -> None:
    assert httpx.get(shared_server + "/nope").json()["error"]["code"] == "not_found"
    r = httpx.get(shared_server + "/v1/batchstring")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_admin_workers_needs_the_admin_key(shared_server: str) -> None:
    assert httpx.get(shared_server + "/admin/workers").status_code == 401
    odd = httpx.get(shared_server + "/admin/workers", headers={"Authorization": b"Bearer \xe9"})
    assert odd.status_code == 401 and odd.json()["error"]["code"] == "unauthorized"
    workers = httpx.get(shared_server + "/admin/workers", headers=ADMIN).json()["workers"]
    assert len(workers) == 2 and {w["state"] for w in workers} <= {"ready", "busy"}
    assert all(isinstance(w["pid"], int) and w["batches"] >= 0 for w in workers)


def test_health_and_readiness(shared_server: str) -> None:
    assert httpx.get(shared_server + "/healthz").status_code == 200
    ready = httpx.get(shared_server + "/readyz").json()
    assert ready["ready"] and ready["workers_ready"] == 2


async def test_sigterm_finishes_in_flight_work_and_leaves_no_process() -> None:
    srv = start_server(workers=2, args=["--batch-latency-ms", "300", *KEYS])
    try:
        async with anyio.create_task_group() as tg:
            results: list[httpx.Response] = []

            async def send() -> None:
                bodies: list[dict[str, object]] = [{"input": f"d{i}"} for i in range(20)]
                results.extend(await post_many(srv.url, bodies, PAID))

            tg.start_soon(send)
            with anyio.fail_after(10):
                while metric(fetch_metrics(srv.url), "batchgate_batch_size_count") < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.02)  # another process: poll its metrics
            os.kill(srv.pid, signal.SIGTERM)
        assert [r.json()["output"] for r in results] == [f"d{i}"[::-1] for i in range(20)]
    finally:
        leftovers = stop_server(srv)
    # uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is a clean exit too.
    assert leftovers == [] and srv.process.returncode in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in srv.log_tail(40)
    errors = [line for line in srv.log_path.read_text().splitlines() if " ERROR " in line]
    assert errors == []  # a clean stop says nothing is wrong (a cell's gateways included)
    srv.log_path.unlink()  # read; a failure above keeps it


async def test_sigterm_says_not_ready_at_once_and_serves_through_the_drain_delay() -> None:
    srv = start_server(workers=1, args=[*KEYS, "--drain-delay-s", "3"])
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as kept:
            assert (await kept.get("/readyz")).status_code == 200
            os.kill(srv.pid, signal.SIGTERM)
            with anyio.fail_after(30):  # another process: poll it (bounded: a hang)
                while (ready := await kept.get("/readyz")).status_code == 200:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            assert ready.status_code == 503 and ready.json()["draining"] is True
            # Balancers are still taking it out of rotation: new connections are served
            # (not ready came first, within the delay: the server still serves).
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as fresh:
                late = await fresh.post("/v1/batchstring", json={"input": "late"}, headers=PAID)
            assert late.status_code == 200 and late.json()["output"] == "etal"
            # It stops by itself once the delay is over.
            await anyio.to_thread.run_sync(lambda: srv.process.wait(timeout=30))
    finally:
        leftovers = stop_server(srv)
    assert leftovers == [] and srv.process.returncode in (0, -signal.SIGTERM)
    srv.log_path.unlink()  # a failure above keeps it


def test_the_admin_key_is_not_in_any_spawned_processs_environment() -> None:
    secret = "s3cret-admin-key"
    with running_server(workers=2, env={"BATCHGATE_ADMIN_KEY": secret}) as srv:
        admin = {"Authorization": f"Bearer {secret}"}
        listing = httpx.get(srv.url + "/admin/workers", headers=admin, timeout=10).json()
        pids = [w["pid"] for w in listing["workers"]] + [g["pid"] for g in listing["gateways"]]
        assert len(pids) >= 2
        for pid in pids:  # what anyone who can read /proc/<pid>/environ would see
            with open(f"/proc/{pid}/environ", "rb") as environ:
                assert secret.encode() not in environ.read()


async def test_sighup_reloads_the_keys_file_without_a_restart(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    entry = '[[keys]]\nkey = "{}"\ntier = "paid"\naccount = "acme"\n'
    keys.write_text(entry.format("old-key"))
    with running_server(workers=1, args=["--keys", str(keys)]) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            async def status(key: str) -> int:
                answer = await client.post("/v1/batchstring", json={"input": "x"},
                                           headers={"Authorization": f"Bearer {key}"})
                return answer.status_code

            assert (await status("old-key"), await status("new-key")) == (200, 401)
            keys.write_text(entry.format(hash_key("new-key")))  # and hashed, this time
            os.kill(srv.pid, signal.SIGHUP)
            with anyio.fail_after(10):  # another process (or K gateways): poll it
                while await status("new-key") != 200:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            with anyio.fail_after(10):
                while await status("old-key") != 401:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
        assert srv.process.poll() is None  # SIGHUP's default would have ended it


WEIGHED = """
[[keys]]
key = "a-key"
tier = "paid"
account = "a"
weight = {}

[[keys]]
key = "b-key"
tier = "paid"
account = "b"

[tiers.paid]
budget_ms = 60000
"""
SLOTS = "batchgate_account_batch_slots_total"


async def test_sighup_gives_the_accounts_their_new_fair_share_weights(tmp_path: Path) -> None:
    """Batches of 4 on one worker: with a and b queued together, a weighing 3 after the
    reload takes 3 of the next batch's 4 slots (2 at the weight it started with)."""
    keys = tmp_path / "keys.toml"
    keys.write_text(WEIGHED.format(1))
    args = ["--keys", str(keys), "--max-batch", "4", "--batch-latency-ms", "300"]
    with running_server(workers=1, args=args) as srv:
        keys.write_text(WEIGHED.format(3))
        os.kill(srv.pid, signal.SIGHUP)
        with anyio.fail_after(10):  # the core's own log line (a cell's core: another process)
            while "fair-share weights now" not in srv.log_path.read_text():  # noqa: ASYNC110
                await anyio.sleep(0.05)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client, \
                anyio.create_task_group() as tg:
            async def send(key: str, n: int) -> None:
                answer = await client.post(
                    "/v1/batchstring", json={"inputs": [key] * n},
                    headers={"Authorization": f"Bearer {key}-key"})
                assert answer.status_code == 200, answer.text

            tg.start_soon(send, "a", 4)  # the worker's first batch: a's, alone
            await metric_reaches(srv.url, 4, SLOTS, tier="paid", account="a")
            tg.start_soon(send, "a", 6)  # both queued behind it
            tg.start_soon(send, "b", 6)
            with anyio.fail_after(10):
                while True:  # the next batch, read before the one after it (300 ms later)
                    shown = fetch_metrics(srv.url)
                    a, b = (metric(shown, SLOTS, tier="paid", account=x) for x in "ab")
                    if a + b >= 8:
                        break
                    await anyio.sleep(0.01)
    assert (a - 4, b) == (3, 1)
