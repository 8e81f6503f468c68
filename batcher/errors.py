"""Errors of the batching layer and the root of every batchgate error.

    BatchgateError
    ├── QueueFull                queues: a tier's hard cap on queued items is reached
    ├── Overloaded               admission refused the item (carries a Retry-After)
    │   ├── OverBudget           the expected wait exceeds the tier's budget
    │   ├── DeadlineUnreachable  the expected wait exceeds the item's own deadline
    │   └── NoWorkerReady        no worker is ready to take it
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


__all__ = ["BatchgateError", "Closed", "DeadlineExceeded", "DeadlineUnreachable",
           "NoWorkerReady", "OverBudget", "Overloaded", "QueueFull"]
