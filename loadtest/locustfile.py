"""Locust load shapes for batchgate, every answer checked, with a pass/fail gate at the end.

Every request sends a unique input to `POST /v1/batchstring`; an answer counts as a success
only if it is HTTP 200 with `{"id": str, "output": <the input reversed>}`. Anything else (a
wrong or missing output, bad JSON, 429, 503, a timeout) is a failure, named by its cause.

Locust is closed-loop: each user sends one request at a time at `--user-rps` requests/s
(`constant_throughput`, default 2/s, so a user keeps its pace while answers take < 500 ms).
A shape asks for `round(rate * scale / user_rps)` users, so the offered rate is its target
as long as latency stays under 1/user_rps; the verdict prints the rate actually reached.

Shapes (`--shape NAME`, or env BATCHGATE_SHAPE; in the web UI also `--class-picker`):

  steady100   100 RPS for 60 s                          (Steady100)
  steady10k   10,000 RPS for 60 s                       (Steady10k)
  burst       1,000 RPS 20 s, 3,000 RPS 20 s, 1,000 RPS 20 s   (Burst)

Each shape starts a step's users at once, each at a random phase within its first period
(1/user_rps), so requests arrive spread out, and it stops by itself at its end. Options:
  --scale F            multiply every rate by F (0.1: steady10k offers 1,000 RPS)
  --rps R              the shape's (base) rate instead of its default, before --scale
  --duration S         steady: seconds in all; burst: seconds of each of its three phases
  --user-rps R         requests/s per user (default 2; keep 1/R above the p99 latency
                       and under uvicorn's 5 s keep-alive)
  --paid-fraction F    share of requests sent with a paid key, the rest free (default 1)
  --paid-key K[,K..]   paid key(s) (default paid-demo-key); users take them round-robin
  --free-key K[,K..]   free key(s) (default free-demo-key)
  --p95-ms MS          gate: P95 of all requests at most MS (default 300; 0: off)
  --max-failure-ratio  gate: failures / requests at most this (default 0.01)
  --min-rate-ratio     gate: requests made / requests the shape asked for, at least
                       this (default 0.8; 0: off): catches a generator that fell behind
At the end one line `verdict: PASS|FAIL ...` is printed and a miss exits 1, so a
deployment script can run it as a gate (P95 as locust rounds it, over the whole run). Add
`--csv PREFIX` for the stats as CSV. Requests still in flight when the shape ends are dropped
by locust and counted nowhere; the gateway records them as 499 client_closed.

Streams: `StreamingUser` sends `--stream-inputs` inputs (default 8; env
BATCHGATE_STREAM_INPUTS) per request as a stream (`--stream-format sse|ndjson`, env
BATCHGATE_STREAM_FORMAT) and checks every event: each input answered once with its output,
no input's error, then the done event, last, with the stream's counts. It reads the stream
as the Python client does, so it needs batchgate-client (`pip install ./api/client`). It
runs only when named (`locust -f loadtest/locustfile.py StreamingUser ...`, or picked with
--class-picker): a run that names no user class runs BatchstringUser alone, as before. The
shapes' rates are then streamed requests per second, each of --stream-inputs inputs.

Run headless against a gateway on port 8000 (start one with, e.g.,
`batchgate serve --model sim --workers 2 --port 8000 --keys examples/keys.toml`):

  100 RPS, 60 s:
    locust -f loadtest/locustfile.py --headless --host http://127.0.0.1:8000 --shape steady100
  burst (2 workers serve 2,000 items/s, so scale it to fit: 500 -> 1,500 -> 500 RPS):
    locust -f loadtest/locustfile.py --headless --host http://127.0.0.1:8000 --shape burst \\
        --scale 0.5
  10,000 RPS scaled to 1,000 RPS on a small machine (one locust process is enough):
    locust -f loadtest/locustfile.py --headless --host http://127.0.0.1:8000 --shape steady10k \\
        --scale 0.1
  10,000 RPS for real, from one load machine with 8+ free cores (one process per core):
    locust -f loadtest/locustfile.py --headless --host http://GATEWAY:8000 --shape steady10k \\
        --processes 8 --paid-key k1,k2,k3,k4,k5,k6
  10,000 RPS across machines (the master runs the shape and the gate; workers send load;
  the master hands its options, --user-rps and the keys included, to every worker):
    locust -f loadtest/locustfile.py --headless --host http://GATEWAY:8000 --shape steady10k \\
        --master --expect-workers 8 --paid-key k1,k2,k3,k4,k5,k6
    locust -f loadtest/locustfile.py --worker --master-host MASTER --processes 4  # x2 machines

Sizing: one locust process offers a few thousand requests a second at most, so 10,000 RPS
takes several processes on machines other than the gateway's; docs/benchmarks.md ("Locust
and the capacity planner") has the figures measured here and the sizing they give.

Keys and rate limits: examples/keys.toml allows one paid key 2,000 RPS and its account
4,000 RPS (free: 1,500 / 3,000), and those rates shrink under queue pressure. A 10,000 RPS run
with the demo keys is mostly answered 429: give the gateway a keys file with enough paid keys
across enough accounts (e.g. six keys in three accounts) and pass them all with --paid-key.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gevent  # type: ignore[import-untyped]
import orjson
from locust import LoadTestShape, constant_throughput, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.env import Environment
from locust.runners import WorkerRunner

PATH = "/v1/batchstring"
logger = logging.getLogger("batchgate.locust")

Phase = tuple[float, float]  # (seconds, requests/s before --scale)
MEDIA = {"sse": "text/event-stream", "ndjson": "application/x-ndjson"}


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _arguments(parser: Any) -> None:
    group = parser.add_argument_group("batchgate")
    group.add_argument("--shape", choices=sorted(SHAPES), default="steady100",
                       env_var="BATCHGATE_SHAPE", help="load shape (default steady100)")
    group.add_argument("--scale", type=float, default=1.0,
                       help="multiply the shape's rates by this (default 1)")
    group.add_argument("--rps", type=float, default=0.0,
                       help="the shape's (base) rate in requests/s instead of its own")
    group.add_argument("--duration", type=float, default=0.0,
                       help="steady: seconds in all; burst: seconds of each phase")
    group.add_argument("--user-rps", type=float, default=2.0,
                       help="requests/s each user sends (default 2)")
    group.add_argument("--paid-fraction", type=float, default=1.0,
                       help="share of requests sent with a paid key (default 1)")
    group.add_argument("--paid-key", default="paid-demo-key", help="paid key(s), comma separated")
    group.add_argument("--free-key", default="free-demo-key", help="free key(s), comma separated")
    group.add_argument("--p95-ms", type=float, default=300.0,
                       help="fail if the P95 latency exceeds this (ms; 0: no check)")
    group.add_argument("--max-failure-ratio", type=float, default=0.01,
                       help="fail if failures/requests exceeds this (default 0.01)")
    group.add_argument("--min-rate-ratio", type=float, default=0.8,
                       help="fail if fewer than this share of the requests the shape asked "
                            "for were made (default 0.8; 0: no check)")
    group.add_argument("--stream-inputs", type=int, default=8, env_var="BATCHGATE_STREAM_INPUTS",
                       help="StreamingUser: inputs per streamed request (default 8)")
    group.add_argument("--stream-format", choices=sorted(MEDIA), default="sse",
                       env_var="BATCHGATE_STREAM_FORMAT",
                       help="StreamingUser: the stream's framing (default sse)")


def _options(environment: Environment) -> Any:
    opts = environment.parsed_options
    if opts is None or not hasattr(opts, "scale"):
        raise RuntimeError("run this file with the locust command (its options are missing)")
    return opts


class PacedUser(FastHttpUser):
    """A closed-loop client at --user-rps, its keys and its unique prefix: what both users
    share (abstract: never run itself)."""

    abstract = True
    network_timeout = 15.0  # above the paid tier's 5 s deadline: the server answers first
    connection_timeout = 5.0
    concurrency = 1  # one request at a time per user: one connection is enough

    def on_start(self) -> None:
        opts = _options(self.environment)
        if not 0.0 <= opts.paid_fraction <= 1.0:
            raise ValueError("--paid-fraction must be within 0..1")
        n = next(_users)
        paid = [k for k in opts.paid_key.split(",") if k]
        free = [k for k in opts.free_key.split(",") if k]
        self._auth = {
            "paid": _auth_header(paid[n % len(paid)] if paid else ""),
            "free": _auth_header(free[n % len(free)] if free else ""),
        }
        self._paid_fraction: float = opts.paid_fraction
        self._pace: Callable[[Any], float] = constant_throughput(opts.user_rps)
        self._prefix = f"{os.urandom(6).hex()}-{n}"  # unique across processes and machines
        self._sent = itertools.count()
        # Locust starts a step's users all at once: a random phase spreads their requests
        # evenly over the period instead of in lock-step bursts. constant_throughput paces
        # from `_cp_last_run` (set when the user was made): restart it after the sleep, or
        # the second request comes early and every user falls back into step.
        gevent.sleep(random.uniform(0.0, 1.0 / opts.user_rps))
        self._cp_last_run = time.perf_counter()
        self._cp_last_wait_time = 0.0

    def wait_time(self) -> float:
        return self._pace(self)

    def _tier(self) -> str:
        return "paid" if random.random() < self._paid_fraction else "free"

    def _text(self) -> str:
        return f"{self._prefix}-{next(self._sent)}-é✓"  # non-ASCII: UTF-8 both ways


class BatchstringUser(PacedUser):
    """One closed-loop client: a unique input per request, its answer checked."""

    @task
    def batchstring(self) -> None:
        tier, text = self._tier(), self._text()
        headers = {"Content-Type": "application/json", **self._auth[tier]}
        with self.client.post(PATH, data=orjson.dumps({"input": text}),  # type: ignore[arg-type]
                              headers=headers,
                              name=f"{PATH} [{tier}]", catch_response=True) as response:
            problem = check_answer(response.status_code, response.content, text)
            if problem is None:
                response.success()
            else:
                response.failure(problem)


class StreamingUser(PacedUser):
    """One closed-loop client of streams: --stream-inputs unique inputs per request, every
    event of its answer checked (`check_stream`). Runs only when named."""

    network_timeout = 60.0  # the whole stream is read before the check

    def on_start(self) -> None:
        super().on_start()
        opts = _options(self.environment)
        if opts.stream_inputs < 1:
            raise ValueError("--stream-inputs must be at least 1")
        self._inputs: int = opts.stream_inputs
        self._format: str = opts.stream_format

    @task
    def stream(self) -> None:
        tier, texts = self._tier(), [self._text() for _ in range(self._inputs)]
        headers = {"Content-Type": "application/json", "Accept": MEDIA[self._format],
                   **self._auth[tier]}
        with self.client.post(PATH, data=orjson.dumps({"inputs": texts}),  # type: ignore[arg-type]
                              headers=headers, name=f"{PATH} [stream {self._format} {tier}]",
                              catch_response=True) as response:
            problem = check_stream(response.status_code, response.content, texts,
                                   self._format)
            if problem is None:
                response.success()
            else:
                response.failure(problem)


@events.init.add_listener  # type: ignore[untyped-decorator]
def _only_named_streams(environment: Environment, **_kwargs: Any) -> None:
    """Locust runs every user class of the file that no one names: keep StreamingUser for
    the runs that name it, so a plain run is what it was. Workers keep it: the master
    says which users they start."""
    named = getattr(environment.parsed_options, "user_classes", None) or []
    if "StreamingUser" not in named and not isinstance(environment.runner, WorkerRunner) \
            and len(environment.user_classes) > 1:
        environment.user_classes[:] = [u for u in environment.user_classes
                                       if u is not StreamingUser]


_users = itertools.count()


def _auth_header(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def check_answer(status: int, body: bytes | None, text: str) -> str | None:
    """None if the answer is right, else the reason (few distinct values: they group)."""
    if status != 200:
        return _not_200(status, body)
    try:
        answer = orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return "200 with a body that is not JSON"
    if not isinstance(answer, dict) or not isinstance(answer.get("output"), str):
        return "200 without an output"
    if not isinstance(answer.get("id"), str):
        return "200 without an id"
    if answer["output"] != expected(text):
        logger.error("wrong output for %r: %r", text, answer["output"][:200])
        return "200 with a wrong output (not this input's)"
    return None


def expected(text: str) -> str:
    """The sim model's output for `text`: it reversed."""
    return text[::-1]


def check_stream(status: int, body: bytes | None, texts: Sequence[str], format: str
                 ) -> str | None:
    """None if a streamed answer to `texts` is right: a 200 of `format` ("sse" or
    "ndjson") whose events answer each input once with its output, then the done event,
    last, counting them; else the reason (few distinct values: they group)."""
    # The client's own reading of a stream (its framing and its events), not a second
    # parser; imported here so that a run without streams needs no batchgate-client.
    from batchgate_client import (
        Done,
        Failure,
        NdjsonDecoder,
        ProtocolError,
        SseDecoder,
        event_from,
    )

    if status != 200:
        return _not_200(status, body)
    decoder = SseDecoder() if format == "sse" else NdjsonDecoder()
    answered: set[int] = set()
    try:
        frames = decoder.feed(body or b"")
        events = [event_from(frame.data, len(texts)) for frame in frames]
    except ProtocolError as exc:
        logger.error("stream breaks the protocol: %s", exc)
        return "stream: breaks the protocol"
    if format == "sse" and [f.id for f in frames] != [str(n) for n in range(len(frames))]:
        return "stream: event ids out of sequence"
    for event in events[:-1]:
        if isinstance(event, Done):
            return "stream: an event after done"
        if event.index in answered:
            return "stream: an input answered twice"
        answered.add(event.index)
        if isinstance(event, Failure):
            return f"stream: an input's error {event.error.code}"
        if event.output != expected(texts[event.index]):
            logger.error("wrong output for %r: %r", texts[event.index], event.output[:200])
            return "stream: a wrong output (not this input's)"
    done = events[-1] if events else None
    if not isinstance(done, Done):
        return "stream: no done event"
    if len(answered) != len(texts):
        return "stream: an input not answered"
    if (done.outputs, done.errors) != (len(texts), 0):
        return "stream: done counts are not the stream's"
    return None


def _not_200(status: int, body: bytes | None) -> str:
    if status == 0:
        return "no answer (connection error or timeout)"
    try:
        code = orjson.loads(body or b"")["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = "?"
    return f"HTTP {status} {code}"


class RateShape(LoadTestShape):
    """Phases of constant rate; users = rate * scale / user_rps, each at a random phase."""

    abstract = True
    shape_name: ClassVar[str]
    phases: ClassVar[Sequence[Phase]]

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._plan: list[Phase] | None = None
        self._users = 0
        self._spawn_rate = 1.0

    def plan(self) -> list[Phase]:
        """The phases after --rps and --duration, rates not yet scaled."""
        if self._plan is None:
            opts = _options(self.runner.environment) if self.runner else None
            self._plan = self.adjust(list(self.phases), opts.rps if opts else 0.0,
                                     opts.duration if opts else 0.0)
        return self._plan

    def adjust(self, phases: list[Phase], rps: float, duration: float) -> list[Phase]:
        base = phases[0][1]
        return [(duration or seconds, rate * (rps / base if rps else 1.0))
                for seconds, rate in phases]

    def _scaling(self) -> tuple[float, float]:
        opts = _options(self.runner.environment) if self.runner else None
        scale, user_rps = (opts.scale, opts.user_rps) if opts else (1.0, 2.0)
        if scale <= 0 or user_rps <= 0:
            raise ValueError("--scale and --user-rps must be positive")
        return scale, user_rps

    def rate_at(self, t: float) -> float | None:
        """Target requests/s (scaled) at t seconds, None once the shape is over."""
        end = 0.0
        for seconds, rate in self.plan():
            end += seconds
            if t < end:
                return rate * self._scaling()[0]
        return None

    def total_s(self) -> float:
        return sum(seconds for seconds, _ in self.plan())

    def expected_requests(self, elapsed: float) -> float:
        """What the users the shape asks for send in `elapsed` s: a step's new users start
        at random phases over one period, so they send half as much in their first period;
        users a step removes stop at once."""
        scale, user_rps = self._scaling()
        total, start, users = 0.0, 0.0, 0
        for seconds, rate in self.plan():
            stop = min(start + seconds, elapsed)
            if stop <= start:
                break
            new = _users_for(rate * scale, user_rps)
            period = 1.0 / user_rps
            ramp = min(period, stop - start) if new > users else 0.0
            total += user_rps * (users * ramp + (new - users) * ramp * ramp / period / 2
                                 + new * (stop - start - ramp))
            start, users = start + seconds, new
        return total

    def elapsed(self) -> float:
        return time.perf_counter() - float(self.start_time)

    def tick(self) -> tuple[int, float] | None:
        rate = self.rate_at(self.elapsed())
        if rate is None:
            return None
        users = _users_for(rate, self._scaling()[1])
        if users != self._users:  # a new target: start (or stop) its users in one step
            self._spawn_rate = float(max(1, abs(users - self._users)))
            self._users = users
        return users, self._spawn_rate


def _users_for(rate: float, user_rps: float) -> int:
    return max(1, round(rate / user_rps))


class Steady100(RateShape):
    shape_name = "steady100"
    phases = ((60.0, 100.0),)


class Steady10k(RateShape):
    shape_name = "steady10k"
    phases = ((60.0, 10_000.0),)


class Burst(RateShape):
    """A base rate, 3x that for 20 s, then the base again."""

    shape_name = "burst"
    phases = ((20.0, 1_000.0), (20.0, 3_000.0), (20.0, 1_000.0))


SHAPES: dict[str, type[RateShape]] = {s.shape_name: s for s in (Steady100, Steady10k, Burst)}


@events.init.add_listener  # type: ignore[untyped-decorator]
def _pick_shape(environment: Environment, **_kwargs: Any) -> None:
    """Locust takes the first shape in the file; --shape / BATCHGATE_SHAPE pick another."""
    opts = environment.parsed_options
    name = getattr(opts, "shape", None)
    if name is None or environment.runner is None or isinstance(environment.runner, WorkerRunner):
        return
    if type(environment.shape_class) is not SHAPES[name]:
        shape = SHAPES[name]()
        shape.runner = environment.runner
        environment.shape_class = shape


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _verdict(environment: Environment, **_kwargs: Any) -> None:
    """On the master (or the only process): check the gates, print one line, set the code."""
    if isinstance(environment.runner, WorkerRunner) or environment.parsed_options is None:
        return
    opts = _options(environment)
    total = environment.stats.total
    requests, failures = total.num_requests, total.num_failures
    p95 = total.get_response_time_percentile(0.95) if requests else 0.0
    ratio = failures / requests if requests else 0.0
    shape = environment.shape_class
    misses: list[str] = []
    rate = ""
    if isinstance(shape, RateShape) and shape.runner is not None:
        elapsed = min(shape.elapsed(), shape.total_s())
        expected = shape.expected_requests(elapsed)
        reached = requests / expected if expected else 0.0
        rate = (f" rate={requests / max(elapsed, 1e-9):.0f}/s over {elapsed:.0f} s "
                f"({reached:.0%} of the {expected:.0f} asked for)")
        if opts.min_rate_ratio and reached < opts.min_rate_ratio:
            misses.append(f"rate {reached:.0%} < {opts.min_rate_ratio:.0%}")
    if requests == 0:
        misses.append("no requests")
    if opts.p95_ms and p95 > opts.p95_ms:
        misses.append(f"p95 {p95:.0f} ms > {opts.p95_ms:g} ms")
    if ratio > opts.max_failure_ratio:
        misses.append(f"failures {ratio:.2%} > {opts.max_failure_ratio:.2%}")
    name = getattr(shape, "shape_name", type(shape).__name__)
    print(f"verdict: {'FAIL' if misses else 'PASS'} shape={name} scale={opts.scale:g} "
          f"requests={requests} failures={failures} ({ratio:.2%}) p95={p95:.0f} ms{rate}"
          + (" misses: " + "; ".join(misses) if misses else ""), flush=True)
    if misses:
        environment.process_exit_code = 1
