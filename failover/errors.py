"""Errors resolved into items by the failover layer.

    BatchgateError (batcher.errors)
    ├── WorkerCrashed        table: the item's batch died with its worker `max_attempts` times
    ├── ShuttingDown         core: shut down before the item ran
    ├── QueryOfDeath         table: run alone, the item killed its worker (refused on sight)
    ├── CallerRefused        core: this caller's inputs keep killing workers (for a while)
    ├── SuspectInput         core: the same input is being judged (it stalled or killed)
    ├── ModelError           table: `batchstring` raised on this item (isolated by bisection)
    │   └── ContractViolation    the model broke the contract (count or types of outputs)
    ├── UnknownModel         models: the request names a model or version not served
    ├── ModelLoading (Overloaded)  models: the version is cold and its load ends past the
    │                        request's deadline (carries a Retry-After)
    ├── ModelFailing (Overloaded)  models: the version's loads keep failing and no worker
    │                        holds it (Retry-After: when one more load may be tried)
    └── ModelUnplaceable     models: no placement can ever give the version a worker on
                             this pool (no load is coming; the message says what to change)
"""

from __future__ import annotations

from batcher import BatchgateError, Overloaded


class WorkerCrashed(BatchgateError):
    """The worker running this item died, `max_attempts` times in a row."""

    code = "worker_crashed"


class ShuttingDown(BatchgateError):
    """Raised by `DispatchCore.abandon`: the server stopped before the item ran."""

    code = "shutting_down"


class ModelLoading(Overloaded):
    """The version a request needs holds no worker yet, and its load would end past the
    request's deadline: Retry-After says when it should be resident."""

    code = "model_loading"


class ModelFailing(Overloaded):
    """The version a request needs holds no worker and its loads keep failing
    (`failover.fleet.failing`): refused at once, never after the request's deadline."""

    code = "model_failing"


class ModelUnplaceable(BatchgateError):
    """The version a request needs holds no worker and no placement can give it one on
    this pool (`failover.fleet.fitting`): refused at once, with no load promised."""

    code = "model_unplaceable"


class UnknownModel(BatchgateError):
    """The request names a model or version that is not served (or was retired)."""

    code = "unknown_model"


class QueryOfDeath(BatchgateError):
    """Run alone, this input killed (or hung) its worker: refused, and for a while refused
    on sight, by a hash of its text, without reaching a worker."""

    code = "query_of_death"


class CallerRefused(BatchgateError):
    """The caller's inputs were convicted as queries of death again and again: all its
    requests are refused for a while, so that fresh crashing inputs cannot spend the
    pool's restarts."""

    code = "caller_refused"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SuspectInput(BatchgateError):
    """The same input is under judgement: its last run stalled or killed its worker. Run
    beside it, it would take a second worker down before the verdict."""

    code = "suspect_input"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelError(BatchgateError):
    """The model raised on this item; carries the exception type, never a traceback."""

    code = "model_error"
    error_type = "Exception"  # the model's exception class name

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type


class ContractViolation(ModelError):
    """The model returned the wrong number of outputs, or something other than strings."""

    code = "contract_violation"


__all__ = [
    "CallerRefused",
    "ContractViolation",
    "ModelError",
    "QueryOfDeath",
    "ShuttingDown",
    "SuspectInput",
    "WorkerCrashed",
]
