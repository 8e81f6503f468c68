"""The quarantine of inputs that killed their worker: by hash, bounded, expiring."""

from __future__ import annotations

import pytest

from failover import Quarantine


def test_a_quarantined_text_is_held_until_its_time_is_up() -> None:
    q = Quarantine(ttl=10.0)
    assert not q.holds(["kill"], 0.0)
    q.add("kill", 0.0)
    assert q.holds(["fine", "kill"], 5.0) and not q.holds(["fine", "killer"], 5.0)
    assert not q.holds(["kill"], 10.0) and len(q) == 0  # expired, and forgotten


def test_it_holds_at_most_max_entries_the_oldest_leaving_first() -> None:
    q = Quarantine(ttl=100.0, max_entries=2)
    for i, text in enumerate(["a", "b", "c"]):
        q.add(text, float(i))
    assert len(q) == 2 and not q.holds(["a"], 3.0) and q.holds(["b"], 3.0)


@pytest.mark.parametrize(("ttl", "max_entries"), [(0.0, 1), (1.0, 0)])
def test_its_bounds_are_validated(ttl: float, max_entries: int) -> None:
    with pytest.raises(ValueError):
        Quarantine(ttl=ttl, max_entries=max_entries)
