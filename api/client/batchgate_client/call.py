"""One request of a call and its retries: decides, does no I/O (the two clients do).

Every attempt lives inside the call's deadline: none starts past it, its timeouts are what
is left of it, a timeout is the deadline passing (DeadlineExceeded), and a wait that would
end past it raises the error that asked for the wait at once."""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from batchgate_client.answers import Outputs, error_from, outputs_from
from batchgate_client.errors import (
    RETRIED,
    BatchgateError,
    ConnectionFailed,
    DeadlineExceeded,
    RateLimited,
    Refused,
)

PATH = "/v1/batchstring"
MAX_INPUTS = 100


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a call retries: at most `max_attempts` per request; after a refusal, its
    Retry-After (at least `retry_after_floor`: a server saying 0 is not asked again at once)
    times 1 to 1 + `jitter`; after a connection error, exponential backoff from `backoff`
    to `backoff_max` seconds with full jitter."""

    max_attempts: int = 5
    backoff: float = 0.05
    backoff_max: float = 2.0
    jitter: float = 0.25
    retry_after_floor: float = 0.1  # a batch takes 100 ms: sooner, nothing has changed

    def wait(self, error: BatchgateError, attempt: int, rng: random.Random) -> float | None:
        """Seconds to wait before attempt `attempt + 1`; None: give up and raise `error`."""
        if not isinstance(error, RETRIED) or attempt >= self.max_attempts:
            return None
        if error.retry_after is not None:
            floored = max(error.retry_after, self.retry_after_floor)
            return floored * (1 + rng.uniform(0, self.jitter))
        return rng.uniform(0, min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))


class Call:
    """One request (at most `MAX_INPUTS` inputs) of a client's call, and its retries."""

    renews_key = True  # after a 429: the key names nothing the server ran

    def __init__(self, inputs: list[str], model: str | None, deadline: float,
                 policy: RetryPolicy, rng: random.Random, keyed: bool,
                 part: bool = False) -> None:
        """`part`: one of the requests of a split call, whose every input a guard may
        refuse while another's are answered."""
        self.body: dict[str, Any] = {"inputs": inputs}
        if model is not None:
            self.body["model"] = model
        self.count, self.deadline, self.policy, self.rng = len(inputs), deadline, policy, rng
        self.part = part
        self.key = uuid.uuid4().hex if keyed else None
        self.attempt = 0

    def request(self, now: float) -> dict[str, Any]:
        """The keyword arguments of the next attempt's POST; raises DeadlineExceeded when
        the deadline has passed. Its `timeout` is what is left of the deadline."""
        remaining = self.deadline - now
        if remaining <= 0:
            raise DeadlineExceeded("the call's deadline passed before an answer", status=0)
        self.attempt += 1
        headers = {"X-Request-Timeout-Ms": str(max(1, math.floor(remaining * 1000)))}
        if self.key is not None:
            headers["Idempotency-Key"] = self.key
        return {"json": self.body, "headers": headers, "timeout": remaining}

    def answered(self, response: httpx.Response, now: float) -> Outputs | float:
        """The outputs, or seconds to wait before retrying; raises the answer's error, or
        ProtocolError for an answer that breaks the contract."""
        if response.status_code == 200:
            return outputs_from(response, self.count)
        error = error_from(response, self.count)
        if isinstance(error, Refused) and self.part:  # the call's verdicts, collated
            return Outputs([None] * self.count, (None,), error.refused)
        return self.failed(error, now)

    def broke(self, exc: Exception, now: float) -> float:
        """Seconds to wait after an attempt that got no answer (`exc`: httpx's transport
        error, or the TimeoutError of a bound on the attempt); raises when none follows."""
        if isinstance(exc, httpx.TimeoutException | TimeoutError):
            # Every timeout of an attempt is what was left of the deadline.
            raise DeadlineExceeded("no answer by the call's deadline", status=0) from exc
        return self.failed(ConnectionFailed(repr(exc)), now)

    def failed(self, error: BatchgateError, now: float) -> float:
        wait = self.policy.wait(error, self.attempt, self.rng)
        if wait is None or now + wait >= self.deadline:
            raise error
        if isinstance(error, RateLimited) and self.key is not None and self.renews_key:
            # Refused before anything ran, so a new key is safe (older servers stored the
            # 429 under its key and replayed it to every retry).
            self.key = uuid.uuid4().hex
        return wait


def chunks(inputs: list[str], size: int) -> list[list[str]]:
    return [inputs[i:i + size] for i in range(0, len(inputs), size)]


__all__ = ["MAX_INPUTS", "PATH", "Call", "RetryPolicy", "chunks"]
