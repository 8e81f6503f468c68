"""Reading and checking streamed answers, and a process's peak memory: what the stream
benchmarks (`loadtest.bench_stream`) share."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
import psutil

from loadtest.server import code_of, fetch_metrics, metric

NDJSON = "application/x-ndjson"
ROUTE = "/v1/batchstring"
SAMPLE_S = 0.01
BATCHED = "batchgate_batch_size_sum"


def inputs(n: int, tag: str = "in", pad: int = 0) -> list[str]:
    """`n` distinct inputs (`pad` characters longer); none reads the same reversed, so an
    echo is caught."""
    return [f"{tag}-{i:05d}-{'x' * pad}xyz" for i in range(n)]


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """A stream's events held against its inputs."""

    outputs: int  # right outputs, one per index
    errors: dict[str, int]  # error events by code, one per index
    missing: int  # indices never answered
    duplicated: int  # events for an index already answered
    wrong: int  # an output other than its input reversed, or an index out of range
    done: bool  # the last event is `done`, alone, and its counts are the events'

    @property
    def ok(self) -> bool:
        return self.done and not (self.missing or self.duplicated or self.wrong or self.errors)

    def __str__(self) -> str:
        if self.ok:
            return "ok"
        bad = {"missing": self.missing, "dup": self.duplicated, "wrong": self.wrong}
        parts = [f"{k} {v}" for k, v in bad.items() if v]
        parts += [f"err {code} {n}" for code, n in sorted(self.errors.items())]
        return ", ".join(parts + ([] if self.done else ["no/bad done"]))


def check_events(events: Sequence[Mapping[str, Any]], texts: Sequence[str]) -> StreamCheck:
    """Every index 0..len(texts)-1 exactly once, as an output (its input reversed) or an
    error, then one `done` whose counts are the output and error events sent."""
    seen: set[int] = set()
    outputs = duplicated = wrong = sent_outputs = sent_errors = 0
    errors: Counter[str] = Counter()
    dones = [n for n, e in enumerate(events) if e.get("done") is True]
    for event in events:
        if event.get("done") is True:
            continue
        sent_errors += "error" in event
        sent_outputs += "error" not in event
        index = event.get("index")
        if not isinstance(index, int) or not 0 <= index < len(texts):
            wrong += 1
        elif index in seen:
            duplicated += 1
        elif "error" in event:
            errors[str(event["error"].get("code"))] += 1
        elif event.get("output") == texts[index][::-1]:
            outputs += 1
        else:
            wrong += 1
        if isinstance(index, int):
            seen.add(index)
    counts = events[-1].get("counts") if dones == [len(events) - 1] else None
    done = counts == {"outputs": sent_outputs, "errors": sent_errors}
    missing = len(texts) - len(seen & set(range(len(texts))))
    return StreamCheck(outputs, dict(errors), missing, duplicated, wrong, done)


class RssPeak:
    """The resident set of one process, sampled every `every_s` by a thread while open."""

    def __init__(self, pid: int, every_s: float = SAMPLE_S) -> None:
        self._proc, self._every_s = psutil.Process(pid), every_s
        self.before = self.peak = self.last = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def rss(self) -> int:
        return int(self._proc.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            with contextlib.suppress(psutil.Error):
                self.last = self.rss()
                self.peak = max(self.peak, self.last)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def headers(key: str, timeout_ms: int, accept: str = NDJSON) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Accept": accept,
            "Content-Type": "application/json", "X-Request-Timeout-Ms": str(timeout_ms)}


@dataclass(slots=True)
class StreamRead:
    """What a client got of one stream: its status, events and when each came."""

    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # monotonic, one per event
    error: str = ""  # a refusal's code, or the client's exception


async def read_stream(client: httpx.AsyncClient, url: str, texts: Sequence[str], key: str,
                      timeout_ms: int, out: StreamRead, limit: int | None = None,
                      flowing: anyio.Event | None = None) -> None:
    """POST `texts` as an NDJSON stream and read its events into `out` (at most `limit`:
    then the connection is dropped; `flowing` is set at the first event). `out` holds what
    came even if this is cancelled."""
    body = orjson.dumps({"inputs": list(texts)})
    try:
        async with client.stream("POST", url + ROUTE, content=body,
                                 headers=headers(key, timeout_ms)) as r:
            out.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                out.error = code_of(r)
                return
            async for line in r.aiter_lines():
                if line:
                    out.events.append(orjson.loads(line))
                    out.times.append(time.monotonic())
                    if flowing is not None:
                        flowing.set()
                    if limit is not None and len(out.events) >= limit:
                        return
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__


async def batched(url: str) -> float:
    """Items sent to workers so far, all models and versions."""
    return metric(await anyio.to_thread.run_sync(fetch_metrics, url), BATCHED)


# -- big -------------------------------------------------------------------------------------


__all__ = ["BATCHED", "NDJSON", "ROUTE", "RssPeak", "StreamCheck", "StreamRead", "batched",
           "check_events", "headers", "inputs", "read_stream"]
