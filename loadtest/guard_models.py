"""A guard for the guard-stage benchmark (`loadtest.bench_guards`), served as
`loadtest.guard_models:refuse_odd`: light, so a worker loads it at once."""

from __future__ import annotations

import re

REFUSED = "refuse:marker"
_COUNTER = re.compile(r"-(\d+)-")  # the shared generator's inputs: <tag>-<counter>-<filler>


def refuse_odd(inputs: list[str]) -> list[str]:
    """Refuse each input whose counter is odd (half of them); allow the rest."""
    out = []
    for s in inputs:
        m = _COUNTER.search(s)
        out.append(REFUSED if m is not None and int(m.group(1)) % 2 else "allow")
    return out


__all__ = ["REFUSED", "refuse_odd"]
