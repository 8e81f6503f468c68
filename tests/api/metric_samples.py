"""Reading a scrape as PromQL's `sum` does: a series is counted whatever labels it has
beyond those asked for (the request, queue and batch series carry model and version)."""

from __future__ import annotations

from collections.abc import Mapping


def total(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`; 0.0 if none."""
    want = {f'{k}="{v}"' for k, v in labels.items()}
    return sum(value for key, value in samples.items()
               if key.partition("{")[0] == name
               and want <= set(key.partition("{")[2].rstrip("}").split(",")))
