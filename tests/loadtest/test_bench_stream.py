"""The stream benchmark's pure parts: the event check, the quantiles, B's schedule, the
share, the keys file and the command lines (no server)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.config import load_keys
from batcher import Tier
from loadtest.bench_stream import (
    A_KEY,
    B_KEY,
    arrivals,
    command,
    main,
    quantiles_ms,
    share_left,
    two_account_keys,
)
from loadtest.streams import check_events, inputs

TEXTS = inputs(5)


def answered(texts: list[str]) -> list[dict[str, Any]]:
    """A right stream of `texts`, in reverse completion order, then its `done`."""
    events: list[dict[str, Any]] = [{"index": i, "output": texts[i][::-1]}
                                    for i in reversed(range(len(texts)))]
    return [*events, {"done": True, "id": "x", "model": "v1",
                      "counts": {"outputs": len(texts), "errors": 0}}]


def test_a_right_stream_in_any_order_is_ok() -> None:
    check = check_events(answered(TEXTS), TEXTS)
    assert check.ok and check.outputs == 5 and str(check) == "ok"


def test_a_missing_index_is_caught() -> None:
    events = answered(TEXTS)
    del events[1]
    events[-1]["counts"]["outputs"] = 4
    check = check_events(events, TEXTS)
    assert not check.ok and check.missing == 1 and check.done


def test_a_duplicated_index_is_caught() -> None:
    events = answered(TEXTS)
    events.insert(0, dict(events[0]))
    events[-1]["counts"]["outputs"] = 6
    check = check_events(events, TEXTS)
    assert not check.ok and check.duplicated == 1 and check.missing == 0


def test_a_wrong_output_or_index_is_caught() -> None:
    events = answered(TEXTS)
    events[0] = {"index": events[0]["index"], "output": "echo"}
    events[1] = {"index": 99, "output": "x"}
    check = check_events(events, TEXTS)
    assert (check.wrong, check.missing, check.outputs) == (2, 1, 3)


def test_error_events_are_counted_by_code() -> None:
    events = answered(TEXTS)
    events[0] = {"index": events[0]["index"], "error": {"code": "timeout", "message": "m"}}
    events[-1]["counts"] = {"outputs": 4, "errors": 1}
    check = check_events(events, TEXTS)
    assert check.errors == {"timeout": 1} and check.done and not check.ok
    assert "err timeout 1" in str(check)


def test_done_must_come_last_once_with_the_events_counts() -> None:
    wrong_counts = answered(TEXTS)
    wrong_counts[-1]["counts"]["outputs"] = 4
    early = answered(TEXTS)
    early.insert(0, early.pop())
    assert not check_events(wrong_counts, TEXTS).done
    assert not check_events(early, TEXTS).done
    assert not check_events(answered(TEXTS)[:-1], TEXTS).done
    assert not check_events([], TEXTS).done


def test_events_read_back_from_ndjson_check_alike() -> None:
    lines = b"\n".join(orjson.dumps(e) for e in answered(TEXTS))
    assert check_events([orjson.loads(line) for line in lines.split(b"\n")], TEXTS).ok


def test_quantiles_are_nearest_rank_in_ms() -> None:
    assert quantiles_ms([i / 1000 for i in range(1, 101)]) == pytest.approx((50, 95, 99))
    assert all(math.isnan(q) for q in quantiles_ms([]))


def test_arrivals_are_seeded_and_inside_the_duration() -> None:
    times = arrivals(20.0, 60.0, 7)
    assert times == arrivals(20.0, 60.0, 7) != arrivals(20.0, 60.0, 8)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 60.0
    assert 1000 < len(times) < 1400  # 1,200 expected


def test_what_b_leaves_and_a_s_share_of_it() -> None:
    assert share_left(3960.0, 20.0, 4000.0) == pytest.approx((3980.0, 3960.0 / 3980.0))
    assert math.isnan(share_left(0.0, 4000.0, 4000.0)[1])


def test_the_keys_file_gives_two_paid_accounts(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(two_account_keys())
    ring = load_keys(path)
    a, b = ring.keys[A_KEY], ring.keys[B_KEY]
    assert (a.tier, b.tier) == (Tier.PAID, Tier.PAID) and a.account != b.account
    assert not ring.anonymous


def test_each_section_names_the_command_that_reproduces_it() -> None:
    a = argparse.Namespace(runs=3, fair_duration=60.0, b_rps=20.0, seed=7, unread_s=10.0,
                           unread_streams=20, unread_pad=0, rcvbuf=0)
    assert command("big", a) == "python -m loadtest.bench_stream --only big --runs 3"
    assert command("leave", a) == "python -m loadtest.bench_stream --only leave"
    assert "--fair-duration 60 --b-rps 20 --seed 7" in command("fair", a)


def test_an_unknown_section_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--only", "big,nope"])
