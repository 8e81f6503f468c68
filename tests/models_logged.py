"""A test model that writes down every input it runs, so a scenario counts how often each
input reached the model: served as `tests.models_logged:batchstring`.

Each batch appends one `<pid>\\t<input>` line per input to the file named by
`BATCHGATE_TEST_RUN_LOG` (nothing if unset), in one write to an O_APPEND descriptor so the
lines of concurrent workers never interleave. The lines are written when the batch starts:
a batch that its core's death interrupted has still run. A batch then takes `BATCH_S`.
"""

from __future__ import annotations

import os
import time

BATCH_S = 0.3
LOG_VARIABLE = "BATCHGATE_TEST_RUN_LOG"


def batchstring(inputs: list[str]) -> list[str]:
    """Each input reversed and marked `logged:`, after logging the batch."""
    log_inputs(inputs)
    time.sleep(BATCH_S)
    return [expected(s) for s in inputs]


def log_inputs(inputs: list[str], variable: str = LOG_VARIABLE) -> None:
    """Append `<pid>\\t<input>` per input to the file named by `variable` (nothing if unset),
    in one write: other test models (the guards) log their runs the same way."""
    path = os.environ.get(variable)
    if path:
        pid = os.getpid()
        data = "".join(f"{pid}\t{s}\n" for s in inputs).encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def expected(text: str) -> str:
    """The answer `batchstring` gives `text`."""
    return f"logged:{text[::-1]}"


__all__ = ["BATCH_S", "LOG_VARIABLE", "batchstring", "expected", "log_inputs"]
