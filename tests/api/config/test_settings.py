"""The settings' own pieces: the workers' bounds as two fields, and validation that reads no
file (what the file system says is checked at the edge, `check_files`)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from api.config import Settings, Workers, check_files
from api.config.settings import parse_workers


@pytest.mark.parametrize(("text", "bounds", "shown"), [
    ("3", Workers(3, 3), "3"), ("1:8", Workers(1, 8), "1:8"), ("2:2", Workers(2), "2")])
def test_workers_are_a_fixed_count_or_min_and_max(text: str, bounds: Workers,
                                                  shown: str) -> None:
    workers = parse_workers(text)
    assert workers == bounds and str(workers) == shown
    assert workers.scaling is (workers.max > workers.min)
    assert pickle.loads(pickle.dumps(workers)) == workers  # crosses to a cell's processes


@pytest.mark.parametrize(("bounds", "message"), [
    (Workers(0), "at least 1"), (Workers(4, 2), "MAX >= MIN")])
def test_bad_bounds_are_refused_with_a_message(bounds: Workers, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(workers=bounds)


def test_a_missing_keys_file_is_the_edges_to_find(tmp_path: Path) -> None:
    settings = Settings(keys=tmp_path / "keys.toml")  # validating it reads nothing
    with pytest.raises(ValueError, match=r"keys file .* not found"):
        check_files(settings)
    (tmp_path / "keys.toml").write_text("")
    check_files(settings)
