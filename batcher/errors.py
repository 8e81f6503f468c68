"""Errors of the batching layer and the root of every batchgate error.

    BatchgateError
    ├── QueueFull                queues: a tier's hard cap on queued items is reached
    ├── Overloaded               admission refused the item (carries a Retry-After)
    │   ├── OverBudget           the expected wait exceeds the tier's budget
    │   ├── DeadlineUnreachable  the expected wait exceeds the item's own deadline
    │   ├── NoWorkerReady        no worker is ready to take it
    │   └── GuardUnavailable     a guard that fails closed could not answer the item within
    │                            its share of the deadline (`failover.fleet.stages`)
    ├── Refused                  a guard refused the item (`refuse:<reason>`)
    ├── Closed                   batcher: draining, nothing new is taken
    └── DeadlineExceeded         batcher: the item's deadline passed before it could run
                                 (also a TimeoutError)

Other packages hang their own trees below BatchgateError; each class names its `code`, and
`api/errors.py` alone maps codes to HTTP statuses.
"""

from __future__ import annotations


class BatchgateError(Exception):
    """Root of every error batchgate raises on purpose."""

    code = "internal"


class QueueFull(BatchgateError):
    """Raised by `TierQueues.put_all` when the tier holds its maximum of items."""

    code = "queue_full"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Overloaded(BatchgateError):
    """Raised by admission control; a subclass says which limit refused."""

    code = "overloaded"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OverBudget(Overloaded):
    """The item would wait longer than its tier allows."""

    code = "over_budget"


class DeadlineUnreachable(Overloaded):
    """The item would wait past its own deadline."""

    code = "deadline_unreachable"


class NoWorkerReady(Overloaded):
    """No worker is ready: nothing could run the item."""

    code = "no_healthy_worker"


class Closed(BatchgateError):
    """Raised by `Batcher.admit` while draining: the server is shutting down."""

    code = "shutting_down"


class DeadlineExceeded(BatchgateError, TimeoutError):
    """The item's deadline passed while it was queued; it never reached a worker."""

    code = "deadline_exceeded"


class GuardUnavailable(Overloaded):
    """A guard could not answer this item within its share of the deadline (no worker, its
    attempts crashed, too slow) and the model fails closed for the item's tier: the model's
    output is never released unguarded."""

    code = "guard_unavailable"


class Refused(BatchgateError):
    """A guard refused this item: it never reaches the next stage. `guard` names the guard
    (a model of the catalogue) and `reason` its reason code; never the guard's text, never
    another input. Settles one input of a request, not the request: the collation keeps it
    beside the others' outputs."""

    code = "refused"

    def __init__(self, guard: str, reason: str) -> None:
        super().__init__(f"refused by the guard {guard}: {reason}")
        self.guard, self.reason = guard, reason


__all__ = ["BatchgateError", "Closed", "DeadlineExceeded", "DeadlineUnreachable",
           "GuardUnavailable", "NoWorkerReady", "OverBudget", "Overloaded", "QueueFull",
           "Refused"]
