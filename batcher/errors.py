"""Errors of the batching layer and the root of every batchgate error.

    BatchgateError
    ├── QueueFull            queues: a tier's hard cap on queued items is reached
    ├── Overloaded           admission: the expected wait exceeds the tier's budget
    └── DeadlineExceeded     batcher: the item's deadline passed before it could run
                             (also a TimeoutError)

Other packages hang their own trees below BatchgateError; `api/errors.py` alone maps them
to HTTP statuses.
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
    """Raised by admission control: the item would wait longer than its tier allows."""

    code = "overloaded"

    def __init__(self, message: str, retry_after: float, code: str = "overloaded") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.code = code


class DeadlineExceeded(BatchgateError, TimeoutError):
    """The item's deadline passed while it was queued; it never reached a worker."""

    code = "deadline_exceeded"


__all__ = ["BatchgateError", "DeadlineExceeded", "Overloaded", "QueueFull"]
