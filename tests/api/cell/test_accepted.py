"""The copies of the models and keys files a cell's children read: a file that passes
replaces its copy, one that does not is refused and the copy before it stays."""

from __future__ import annotations

from pathlib import Path

from api.cell.accepted import Accepted
from api.config import Settings, load_keys

MODELS = '[models.a]\n[models.a.versions.v1]\nspec = "sim"\n'
KEYS = '[[keys]]\nkey = "k1"\ntier = "paid"\n'


def cell(tmp_path: Path) -> tuple[Accepted, Path, Path]:
    models, keys = tmp_path / "models.toml", tmp_path / "keys.toml"
    models.write_text(MODELS)
    keys.write_text(KEYS)
    settings = Settings(models=str(models), keys=keys)
    return Accepted(settings, tmp_path / "accepted"), models, keys


def test_the_children_read_the_copies_of_the_files_accepted(tmp_path: Path) -> None:
    accepted, _, _ = cell(tmp_path)
    assert accepted.read() and accepted.refused == ()
    shown = accepted.settings()
    assert shown.models is not None and shown.keys is not None
    assert Path(shown.models).read_text() == MODELS and shown.keys.read_text() == KEYS
    assert Path(shown.models).parent == tmp_path / "accepted"
    assert shown.keys.stat().st_mode & 0o077 == 0  # keys inside: the owner's alone


def test_a_broken_file_is_refused_and_its_accepted_copy_stays(tmp_path: Path) -> None:
    accepted, models, keys = cell(tmp_path)
    accepted.read()
    models.write_text("[models.a\n")
    keys.write_text(KEYS.replace("paid", "gold"))
    assert not accepted.read()
    assert [r.file for r in accepted.refused] == [str(models), str(keys)]
    assert str(models) in accepted.refused[0].reason and ".new" not in accepted.refused[0].reason
    shown = accepted.settings()
    assert Path(str(shown.models)).read_text() == MODELS
    assert shown.keys is not None and "k1" in load_keys(shown.keys).keys
    assert sorted(p.name for p in (tmp_path / "accepted").iterdir()) == ["keys.toml",
                                                                          "models.toml"]


def test_a_fixed_file_is_accepted_again(tmp_path: Path) -> None:
    accepted, _, keys = cell(tmp_path)
    accepted.read()
    keys.write_text("not toml [")
    assert not accepted.read()
    keys.write_text(KEYS.replace("k1", "k2"))
    assert accepted.read() and accepted.refused == ()
    shown = accepted.settings()
    assert shown.keys is not None and set(load_keys(shown.keys).keys) == {"k2"}
