"""Test guards (and a model for post guards to judge), served as `tests.models_guards:<name>`.

A guard is a batchstring model whose outputs are verdicts, `"allow"` or `"refuse:<reason>"`.
Each guard here answers on a marker any test can send, so a scenario chooses per input
whether it is refused, hangs the guard or kills it. No torch: they start light.
"""

from __future__ import annotations

import os
import time

from tests.models_logged import log_inputs

ALLOW = "allow"
GUARD_LOG_VARIABLE = "BATCHGATE_TEST_GUARD_LOG"  # where `logged_refuse_marker` logs its runs


def refuse_marker(inputs: list[str]) -> list[str]:
    """Refuse any input containing BLOCKME with `refuse:marker`; allow the rest."""
    return ["refuse:marker" if "BLOCKME" in s else ALLOW for s in inputs]


def logged_refuse_marker(inputs: list[str]) -> list[str]:
    """`refuse_marker` that first logs each input it judges (`<pid>\\t<input>`) to the file
    named by $BATCHGATE_TEST_GUARD_LOG, so a scenario counts how often the guard ran."""
    log_inputs(inputs, GUARD_LOG_VARIABLE)
    return refuse_marker(inputs)


def allow_all(inputs: list[str]) -> list[str]:
    """Allow everything."""
    return [ALLOW] * len(inputs)


def hang(inputs: list[str]) -> list[str]:
    """Never return for a batch holding an input containing HANG (a wedged guard: the core's
    hang watchdog kills it); allow otherwise. Sleeps in a loop, so no single sleep's end
    lets it answer."""
    if any("HANG" in s for s in inputs):
        while True:
            time.sleep(60)
    return [ALLOW] * len(inputs)


SLOW_S = 1.5  # past a guard's share of 300 ms, well inside a request's 5 s


def slow(inputs: list[str]) -> list[str]:
    """Take `SLOW_S` on a batch holding an input containing SLOW (a guard too slow for its
    share, that then answers: a server stops without waiting out a hang); allow all."""
    if any("SLOW" in s for s in inputs):
        time.sleep(SLOW_S)
    return [ALLOW] * len(inputs)


def crash(inputs: list[str]) -> list[str]:
    """Die (`os._exit(1)`) on a batch holding an input containing CRASH; allow otherwise."""
    if any("CRASH" in s for s in inputs):
        os._exit(1)
    return [ALLOW] * len(inputs)


def bad_verdict(inputs: list[str]) -> list[str]:
    """Break the guard contract: answer "maybe" for every input (strings, one per input, so
    the batch contract holds and only the verdict is wrong)."""
    return ["maybe"] * len(inputs)


def refuse_output_marker(inputs: list[str]) -> list[str]:
    """A post guard: refuse any output containing LEAK with `refuse:leak`; allow the rest.
    Given `{"input", "output"}` objects (`with_input`), it judges the whole text alike."""
    return ["refuse:leak" if "LEAK" in s else ALLOW for s in inputs]


def leak_model(inputs: list[str]) -> list[str]:
    """A model (not a guard) whose output for an input containing "secret" holds LEAK, for
    `refuse_output_marker` to catch; any other output is `ok:<input>`."""
    return [f"LEAK:{s}" if "secret" in s else f"ok:{s}" for s in inputs]


__all__ = [
    "ALLOW",
    "GUARD_LOG_VARIABLE",
    "SLOW_S",
    "allow_all",
    "bad_verdict",
    "crash",
    "hang",
    "leak_model",
    "logged_refuse_marker",
    "refuse_marker",
    "refuse_output_marker",
    "slow",
]
