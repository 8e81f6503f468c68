"""The open-loop probe, against a tiny in-process HTTP server whose answers we control
(and, marked e2e, against the real `batchgate serve --model sim`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import orjson
import pytest

from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult, percentile
from loadtest.server import fetch_metrics, metric, running_server

Answer = Callable[[str], str]


def reverse(text: str) -> str:
    return text[::-1]


class FakeServer:
    """Answers `POST` like the gateway: `{"output": answer(input)}` after `delay` seconds,
    one request at a time per connection (HTTP/1.1 keep-alive)."""

    def __init__(
        self, answer: Answer = reverse, delay: float = 0.0, hang: bool = False, status: int = 200
    ) -> None:
        self.answer, self.delay, self.hang, self.status = answer, delay, hang, status
        self.authorizations: list[str] = []
        self.handlers: set[asyncio.Task[object]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                headers = dict(
                    line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if line
                )
                self.authorizations.append(headers.get("Authorization", ""))
                body = orjson.loads(await reader.readexactly(int(headers["Content-Length"])))
                if self.hang:
                    await asyncio.sleep(3600)
                await asyncio.sleep(self.delay)
                out = orjson.dumps({"id": "x", "output": self.answer(body["input"])})
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (self.status, len(out), out)
                )
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(fake: FakeServer) -> AsyncIterator[str]:
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in fake.handlers:  # Python 3.11 has no Server.abort_clients()
            task.cancel()
        await asyncio.gather(*fake.handlers, return_exceptions=True)


def probe(fake: FakeServer, **config: object) -> ProbeResult:
    async def go() -> ProbeResult:
        async with serving(fake) as url:
            return await run_probe(ProbeConfig(url=url, **config))  # type: ignore[arg-type]

    return asyncio.run(go())


def test_correct_answers_count_as_ok() -> None:
    r = probe(FakeServer(), rps=200, duration_s=0.5, arrival="fixed")
    assert r.scheduled == 100
    assert (r.ok, r.wrong, r.lost) == (100, 0, 0)
    assert r.statuses == {200: 100}


def test_a_wrong_output_counts_as_wrong() -> None:
    def every_other_unreversed(text: str) -> str:
        return text if int(text[1:].split("-")[0]) % 2 else text[::-1]

    r = probe(FakeServer(every_other_unreversed), rps=200, duration_s=0.5, arrival="fixed")
    assert (r.ok, r.wrong) == (50, 50)
    assert r.latency.count == 50  # latencies of correct answers only


def test_latency_runs_from_the_scheduled_time_not_the_send() -> None:
    # One connection, 30 ms per answer, 100 requests/s offered: requests queue in the
    # client, and that wait is the server's latency, not hidden by a late send.
    r = probe(FakeServer(delay=0.03), rps=100, duration_s=0.5, arrival="fixed", connections=1)
    assert r.ok == 50
    assert r.latency.p50 > 0.2
    assert r.latency.max > 0.8
    assert r.conn_waits > 0


def test_a_refusal_is_counted_by_status_with_its_own_latency() -> None:
    r = probe(FakeServer(status=503, delay=0.01), rps=100, duration_s=0.3, arrival="fixed")
    assert r.statuses == {503: 30}
    assert (r.ok, r.wrong, r.lost, r.rejected) == (0, 0, 0, 30)
    assert r.latency.count == 0
    assert 0.01 <= r.refusal_latency.p50 < 0.1


def test_stops_by_itself_when_the_server_never_answers() -> None:
    started = time.monotonic()
    r = probe(FakeServer(hang=True), rps=50, duration_s=0.4, timeout_s=0.3)
    assert time.monotonic() - started < 2.0
    assert r.ok == 0
    assert r.lost == r.sent == r.errors["timeout"]


def test_a_refused_connection_is_lost_not_hung() -> None:
    async def go() -> ProbeResult:
        async with serving(FakeServer()) as url:
            pass  # closed: nothing listens there any more
        return await run_probe(ProbeConfig(url=url, rps=50, duration_s=0.2, timeout_s=1.0))

    started = time.monotonic()
    r = asyncio.run(go())
    assert time.monotonic() - started < 2.0
    assert r.lost == r.sent > 0
    assert set(r.errors) <= {"connect", "timeout"}


def test_the_in_flight_bound_sheds_instead_of_queueing() -> None:
    r = probe(FakeServer(hang=True), rps=200, duration_s=0.3, timeout_s=0.5, max_in_flight=5)
    assert r.sent == 5
    assert r.shed == r.scheduled - 5


def test_a_mix_sends_each_class_its_headers_and_reports_it_apart() -> None:
    fake = FakeServer()
    classes = (TrafficClass.bearer("paid", "p-key", 3), TrafficClass.bearer("free", "f-key"))
    r = probe(fake, rps=400, duration_s=0.5, classes=classes, seed=1, connections=16)
    paid, free = r.classes["paid"], r.classes["free"]
    assert paid.ok + free.ok == r.ok == r.sent
    assert paid.ok > 2 * free.ok > 0
    assert fake.authorizations.count("Bearer p-key") == paid.sent


def test_percentile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert (percentile(xs, 0.5), percentile(xs, 0.95), percentile(xs, 1.0)) == (50, 95, 100)
    assert percentile([], 0.5) == 0.0


@pytest.mark.e2e
def test_the_real_server_answers_every_request_correctly() -> None:
    with running_server(workers=1) as srv:
        cfg = ProbeConfig(url=srv.url, rps=200, duration_s=2.0, timeout_s=5.0)
        r = asyncio.run(run_probe(cfg))
        batches = metric(fetch_metrics(srv.url), "batchgate_batch_size_count")
    assert r.ok == r.sent > 300
    assert (r.wrong, r.lost) == (0, 0)
    assert r.latency.p50 >= 0.1  # the sim model's fixed batch latency
    assert batches >= 1


def test_answers_slower_than_expected_open_more_connections_not_a_queue_in_the_client() -> None:
    # 8 connections to start (100/s x 10 ms x 2, at least 8), answers taking 150 ms: the
    # 15 in flight at once each get one (a pool held at 8 would queue them in the client).
    r = probe(FakeServer(delay=0.15), rps=100, duration_s=0.5, arrival="fixed",
              expected_latency_s=0.01)
    assert r.ok == 50
    assert r.connections >= 14
