"""A user model whose first import, across all processes, kills its worker: one worker of a
pool dies while loading and the others come up (the marker file says who went first)."""

import os

try:
    os.close(os.open(os.environ["BATCHGATE_TEST_CRASH_ONCE"], os.O_CREAT | os.O_EXCL))
except FileExistsError:
    pass
else:
    os._exit(3)


def batchstring(inputs: list[str]) -> list[str]:
    return [s[::-1] for s in inputs]
