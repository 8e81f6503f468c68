"""Every knob of the service in one frozen record, validated with a readable message.

The record is also the one definition of `batchgate serve`'s flags: each field's metadata
holds its help text (and, where the type alone is not enough, its parser and how to show
its default), and `api/config/flags.py` derives the flags, the `BATCHGATE_*` variables and
the table of docs/operations.md from it, so the three can no longer drift. Built once, at
the edge; packages below `api/` receive the parts they need and never read the environment.

Validating the record reads no file: what only the file system can say (the keys file is
there, the SQLite file's folder is) is `check_files`, called at the edge before anything
is built, where the files are then loaded.

A gateway process holds these settings too, so this module loads neither the dispatch core
nor the pool: the model spec and the Ray resources are checked where the core is built
(`api.door.service.check_core_settings`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from api.config.state import StateSpec, parse_state
from batcher import MAX_BATCH

ACCESS_LOG_FORMATS = ("off", "json")
POOLS = ("process", "ray")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_gateways(text: str) -> int:
    """A count, or `auto`: one gateway per core beyond the one the core process keeps."""
    if text.strip().lower() == "auto":
        return max(1, (os.cpu_count() or 1) - 1)
    return int(text)


@dataclass(frozen=True, slots=True, init=False)
class Workers:
    """`--workers`: the pool's bounds. N is a fixed pool (`min` = `max` = N); MIN:MAX a pool
    that follows the load within them, starting with `min`."""

    min: int
    max: int

    def __init__(self, min: int, max: int | None = None) -> None:
        object.__setattr__(self, "min", min)
        object.__setattr__(self, "max", min if max is None else max)

    @property
    def scaling(self) -> bool:
        """Whether the pool follows the load (MAX above MIN)."""
        return self.max > self.min

    def __str__(self) -> str:
        return f"{self.min}:{self.max}" if self.scaling else str(self.min)


def parse_workers(text: str) -> Workers:
    """N, or MIN:MAX."""
    least, colon, most = text.strip().partition(":")
    return Workers(int(least), int(most) if colon else None)


def doc(
    help: str, *, parse: Callable[[str], Any] | None = None, shown: str | None = None,
    secret: bool = False,
) -> dict[str, Any]:
    """A field's metadata, what its flag needs: `help`, a `parse`r when the annotation's
    type is not enough, `shown` for a default that is computed, `secret` to mask it."""
    return {"help": help, "parse": parse, "shown": shown, "secret": secret}


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = field(default="127.0.0.1", metadata=doc("address to bind"))
    port: int = field(default=8000, metadata=doc("port to bind"))
    grpc_port: int | None = field(default=None, metadata=doc(
        "also serve the Open Inference Protocol's gRPC service (KServe v2, what "
        "tritonclient.grpc speaks) on this port, at --host; a cell's gateways share it",
        shown="off"))
    model: str = field(default="minilm", metadata=doc(
        "minilm (the real model), sim (100 ms a batch, no CPU, reverses each input), "
        "or module:function naming any batchstring"))
    models: str | None = field(default=None, metadata=doc(
        "a TOML catalogue of the models and versions to serve (examples/models.toml); "
        "replaces --model, which is a catalogue of one model named default"))
    workers: Workers = field(default=Workers(1), metadata=doc(
        "workers, one per GPU: processes on this host (pinned with CUDA_VISIBLE_DEVICES; on "
        "the CPU the cores are split among them), or with --pool ray actors in the cluster; "
        "MIN:MAX: as many as the load needs within those bounds, starting with MIN",
        parse=parse_workers))
    scale_down_delay_s: float = field(default=300.0, metadata=doc(
        "with --workers MIN:MAX, how long capacity must stay well above demand before a "
        "worker is retired (one at a time), and how long after a scale-up none is"))
    gateways: int = field(default=1, metadata=doc(
        "HTTP gateway processes in front of one core, or auto (1: a single process)",
        parse=parse_gateways))
    gpus: int | None = field(default=None, metadata=doc(
        "CUDA devices to use; 0 runs on the CPU", shown="all torch sees"))
    pool: str = field(default="process", metadata=doc(
        "process (a worker process per GPU of this host) or ray (a Ray actor per GPU "
        "anywhere in a Ray cluster; needs batchgate[ray])"))
    ray_address: str | None = field(default=None, metadata=doc(
        "the Ray cluster to join with --pool ray: its head's address, head-node:6379",
        shown="RAY_ADDRESS, else a local Ray started and stopped with the server"))
    ray_worker_resources: str = field(default="GPU=1", metadata=doc(
        "what each Ray worker holds, NAME[=AMOUNT],...: on a CPU-only cluster a custom "
        "resource its nodes declare, one unit per worker slot"))
    max_batch: int = field(default=MAX_BATCH, metadata=doc(
        "items per batch (never above the contract's 100)"))
    max_wait_ms: float = field(default=50.0, metadata=doc(
        "the longest an item waits for a fuller batch while a worker is free"))
    idle_trigger: bool = field(default=True, metadata=doc(
        "flush at once while more than one worker is idle"))
    max_batch_chars: int | None = field(default=None, metadata=doc(
        "characters per batch (one longer input still runs alone), like vLLM's "
        "max_num_batched_tokens",
        shown="learned from batch times: a batch runs at most half of what the top tier's "
              "budget leaves after max-wait-ms (or 1.5 x a short batch, if longer); a cut "
              "holds at most twice the largest batch measured within it (20,000 at first)"))
    keys: Path | None = field(default=None, metadata=doc(
        "TOML keys file: keys -> tier and account, admin keys, per-tier limits",
        shown="none"))
    admin_key: str | None = field(default=None, metadata=doc(
        "one more key allowed on /admin/*", shown="none", secret=True))
    batch_latency_ms: float | None = field(default=None, metadata=doc(
        "pad every batch to at least this long (emulates the GPU's fixed latency)",
        shown="the model's own (100 for sim), else 0"))
    drain_delay_s: float = field(default=5.0, metadata=doc(
        "on SIGTERM: /readyz turns 503 at once, and the server keeps accepting and serving "
        "this long before it stops (a second signal skips it)"))
    max_attempts: int = field(default=12, metadata=doc(
        "deaths of an item's worker, isolation included, then 503 worker_crashed"))
    hedge_after_ms: float = field(default=500.0, metadata=doc(
        "a batch running past max(this, 3 x the recent P99 batch time scaled by its input "
        "size) is re-run at once on another worker, the first answer wins (0: never)"))
    hang_timeout_ms: float | None = field(default=None, metadata=doc(
        "a batch running longer gets its worker killed (and is re-run if no hedge answered)",
        shown="max(5 s, 20 x the recent P99 batch time scaled by its input size); 60 s "
              "until 16 batches have run"))
    restart: bool = field(default=True, metadata=doc(
        "restart dead workers (exponential backoff from 0.5 s to 30 s)"))
    ready_timeout_s: float = field(default=300.0, metadata=doc(
        "how long a worker may take to load its model"))
    worker_max_rss_mb: int | None = field(default=None, metadata=doc(
        "a worker holding more memory than this (its resident set, in MiB; Linux) after a "
        "batch is replaced before its next one, which waits for the new one to load",
        shown="off"))
    launcher: bool = field(default=True, metadata=doc(
        "fork each worker from a launcher process that imports the model's libraries and "
        "holds its weights once (off: spawn each, importing and loading from scratch)"))
    parked_max: int = field(default=2, metadata=doc(
        "workers let go (switched away or retired) that park instead of exiting: weights "
        "in host memory, woken in place of a load; past it the oldest exits (0: none "
        "parks)"))
    parked_ram_mb: int | None = field(default=None, metadata=doc(
        "host memory the parked workers may hold together (resident sets, MiB); past it "
        "the oldest exits", shown="off"))
    queue_capacity: int = field(default=20_000, metadata=doc(
        "hard cap on queued items per tier: the memory bound"))
    max_request_timeout_ms: float = field(default=60_000.0, metadata=doc(
        "cap on X-Request-Timeout-Ms"))
    max_body_bytes: int = field(default=1_048_576, metadata=doc("request body limit in bytes"))
    max_input_chars: int = field(default=10_000, metadata=doc("characters per input string"))
    max_inputs: int = field(default=MAX_BATCH, metadata=doc("strings per request in `inputs`"))
    max_stream_inputs: int = field(default=10_000, metadata=doc(
        "strings per streamed request (Accept: text/event-stream or application/x-ndjson); "
        "their inputs ride many batches, fed through a window"))
    max_stream_body_bytes: int = field(default=16 << 20, metadata=doc(
        "a streamed request's body limit in bytes"))
    fair_share: bool = field(default=True, metadata=doc(
        "fill batches by weighted fair share between the accounts of a tier (weights in the "
        "keys file; off: first come, first served within a tier)"))
    max_connections: int = field(default=4096, metadata=doc(
        "open connections the server holds, a cell's gateways together; one more is "
        "answered 503 too_many_connections and closed"))
    head_timeout_s: float = field(default=10.0, metadata=doc(
        "to send a request's head, from connecting (or the previous answer): then 408, or a "
        "quiet close if nothing came"))
    body_timeout_s: float = field(default=30.0, metadata=doc(
        "to send the body once the head is in: then 408"))
    max_header_bytes: int = field(default=16_384, metadata=doc(
        "request line and headers, in bytes: 431 beyond"))
    max_headers: int = field(default=100, metadata=doc("headers per request: 431 beyond"))
    idempotency_ttl_s: float = field(default=86_400.0, metadata=doc(
        "how long idempotent answers are kept"))
    idempotency_max_entries: int = field(default=100_000, metadata=doc(
        "how many idempotent answers are kept"))
    idempotency_max_bytes: int = field(default=256 << 20, metadata=doc(
        "memory the kept idempotent answers may take, in bytes"))
    idempotency_account_share: float = field(default=0.25, metadata=doc(
        "share of either bound one account may hold: one account cannot evict the rest"))
    state: str = field(default="memory", metadata=doc(
        "where kept answers (and with redis, rate limits) live: memory, sqlite:PATH (they "
        "outlive the core and the server), or redis://HOST:PORT/DB (shared by cells)"))
    access_log: str = field(default="off", metadata=doc(
        "off, or json: one JSON line per request on stdout (never inputs or outputs)"))
    log_level: str = field(default="info", metadata=doc("debug, info, warning or error"))
    otlp_endpoint: str | None = field(default=None, metadata=doc(
        "send each request's trace (spans of every process it crosses) over OTLP/HTTP to "
        "this collector, http://HOST:4318 (needs batchgate[otel])", shown="off"))
    otlp_sample: float = field(default=1.0, metadata=doc(
        "with --otlp-endpoint, the share of requests that bring no traceparent which start a "
        "trace (a caller's traceparent is followed as it says)"))

    def state_spec(self) -> StateSpec:
        """`--state` read: where kept answers live (the one reading of this text, made
        when the settings were: `parse_state` keeps it)."""
        return parse_state(self.state)

    def __post_init__(self) -> None:
        _check(1 <= self.port <= 65535, f"port must be within 1..65535, got {self.port}")
        _check(self.grpc_port is None or 1 <= self.grpc_port <= 65535,
               f"grpc-port must be within 1..65535, got {self.grpc_port}")
        _check(self.grpc_port != self.port, "grpc-port must differ from port")
        _check(self.workers.min >= 1, f"workers must be at least 1, got {self.workers}")
        _check(self.workers.max >= self.workers.min,
               f"workers MIN:MAX needs MAX >= MIN, got {self.workers}")
        _check(self.scale_down_delay_s >= 0, "scale-down-delay-s must be >= 0")
        _check(self.pool in POOLS, f"pool must be process or ray, got {self.pool!r}")
        _check(self.gpus is None or self.gpus >= 0, f"gpus must be >= 0, got {self.gpus}")
        _check(1 <= self.gateways <= 64, f"gateways must be within 1..64, got {self.gateways}")
        _check(
            1 <= self.max_batch <= MAX_BATCH,
            f"max-batch must be within 1..{MAX_BATCH} (the contract's limit), "
            f"got {self.max_batch}",
        )
        _check(self.max_wait_ms >= 0, f"max-wait-ms must be >= 0, got {self.max_wait_ms}")
        _check(self.max_batch_chars is None or self.max_batch_chars >= 1,
               f"max-batch-chars must be at least 1, got {self.max_batch_chars}")
        _check(
            self.batch_latency_ms is None or self.batch_latency_ms >= 0,
            "batch-latency-ms must be >= 0",
        )
        _check(self.max_attempts >= 1, "max-attempts must be at least 1")
        _check(self.drain_delay_s >= 0, "drain-delay-s must be >= 0")
        _check(
            self.hang_timeout_ms is None or self.hang_timeout_ms > 0,
            "hang-timeout-ms must be > 0",
        )
        _check(self.hedge_after_ms >= 0, "hedge-after-ms must be >= 0")
        _check(self.queue_capacity >= 1, "queue-capacity must be at least 1")
        _check(self.worker_max_rss_mb is None or self.worker_max_rss_mb >= 1,
               "worker-max-rss-mb must be at least 1")
        _check(self.parked_max >= 0, "parked-max must be at least 0")
        _check(self.parked_ram_mb is None or self.parked_ram_mb >= 1,
               "parked-ram-mb must be at least 1")
        _check(self.max_request_timeout_ms > 0, "max-request-timeout-ms must be > 0")
        _check(self.max_body_bytes >= 1024, "max-body-bytes must be at least 1024")
        _check(self.max_input_chars >= 1, "max-input-chars must be at least 1")
        _check(1 <= self.max_inputs <= MAX_BATCH, f"max-inputs must be within 1..{MAX_BATCH}")
        _check(self.max_stream_inputs >= self.max_inputs,
               "max-stream-inputs must be at least max-inputs")
        _check(self.max_stream_body_bytes >= self.max_body_bytes,
               "max-stream-body-bytes must be at least max-body-bytes")
        _check(self.max_connections >= 1, "max-connections must be at least 1")
        _check(self.head_timeout_s > 0 and self.body_timeout_s > 0,
               "head-timeout-s and body-timeout-s must be > 0")
        _check(self.max_header_bytes >= 1024, "max-header-bytes must be at least 1024")
        _check(self.max_headers >= 8, "max-headers must be at least 8")
        _check(self.idempotency_ttl_s > 0, "idempotency-ttl-s must be > 0")
        _check(self.idempotency_max_entries >= 1, "idempotency-max-entries must be >= 1")
        _check(self.idempotency_max_bytes >= 1, "idempotency-max-bytes must be >= 1")
        _check(0 < self.idempotency_account_share <= 1,
               "idempotency-account-share must be in (0, 1]")
        parse_state(self.state)  # ValueError with a readable message; read once, kept
        _check(self.access_log in ACCESS_LOG_FORMATS,
               f"access-log must be off or json, got {self.access_log!r}")
        _check(self.log_level in LOG_LEVELS,
               f"log-level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        _check(0.0 <= self.otlp_sample <= 1.0,
               f"otlp-sample must be within 0..1, got {self.otlp_sample}")
        _check(self.otlp_endpoint is None or _is_http_url(self.otlp_endpoint),
               f"otlp-endpoint must be an http(s) URL like http://localhost:4318, got "
               f"{self.otlp_endpoint!r}")


def check_files(settings: Settings) -> None:
    """What only the file system can say of `settings`, at the edge (the settings' own
    validation reads no file): the keys file is there, and the folder of a SQLite state
    file. ValueError with a readable message."""
    keys = settings.keys
    _check(keys is None or keys.is_file(), f"keys file {keys} not found")
    path = settings.state_spec().path
    folder = None if path is None else path.parent
    _check(folder is None or folder.is_dir(),
           f"state {settings.state!r}: the folder {folder} does not exist")


def _is_http_url(text: str) -> bool:
    try:
        url = urlsplit(text)
        url.port  # noqa: B018  (raises ValueError for a port that is not one)
    except ValueError:
        return False
    return url.scheme in ("http", "https") and bool(url.hostname)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


__all__ = ["Settings", "Workers", "check_files", "doc", "parse_bool", "parse_gateways",
           "parse_workers"]
