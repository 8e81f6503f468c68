"""What `batchgate serve` makes of secrets that are not secret: the public demo keys in any
form off loopback, and a keys file that others may read."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from api.cli import main, refuse_public_demo_keys
from api.config import Settings, hash_key

PUBLIC = "0.0.0.0"


def keys_file(folder: Path, key: str, mode: int = 0o600) -> Path:
    path = folder / "keys.toml"
    path.write_text(f'[[keys]]\nkey = "{key}"\ntier = "paid"\n')
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("demo", ["paid-demo-key", "free-demo-key"])
def test_a_demo_key_held_hashed_is_refused_off_loopback(tmp_path: Path, demo: str) -> None:
    hashed = keys_file(tmp_path, hash_key(demo))
    with pytest.raises(ValueError, match="public demo keys"):
        refuse_public_demo_keys(Settings(host=PUBLIC, keys=hashed))
    refuse_public_demo_keys(Settings(host="127.0.0.1", keys=hashed))  # loopback: fine


def test_the_demo_admin_key_held_hashed_is_refused_off_loopback(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[admin]\nkeys = ["{hash_key("admin-demo-key")}"]\n')
    with pytest.raises(ValueError, match="public demo keys"):
        refuse_public_demo_keys(Settings(host=PUBLIC, keys=path))


@pytest.mark.parametrize("admin", ["admin-demo-key", hash_key("admin-demo-key")])
def test_the_demo_admin_key_from_the_environment_is_refused_off_loopback(admin: str) -> None:
    with pytest.raises(ValueError, match="BATCHGATE_ADMIN_KEY"):
        refuse_public_demo_keys(Settings(host=PUBLIC, admin_key=admin))
    refuse_public_demo_keys(Settings(host="::1", admin_key=admin))  # loopback: fine
    refuse_public_demo_keys(Settings(host=PUBLIC, admin_key="an-admin-secret"))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660], ids=oct)
def test_a_keys_file_open_to_others_is_named_with_its_mode_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    path = keys_file(tmp_path, "paid-demo-key", mode)  # refused after the warning: no server
    with caplog.at_level(logging.WARNING, logger="batchgate"):
        assert main(["serve", "--keys", str(path), "--host", PUBLIC, "--model", "sim"]) == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(path) in warned[0] and f"{mode:04o}" in warned[0]


def test_a_keys_file_only_its_owner_reads_is_taken_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = keys_file(tmp_path, "paid-demo-key", 0o600)
    with caplog.at_level(logging.WARNING, logger="batchgate"):
        assert main(["serve", "--keys", str(path), "--host", PUBLIC, "--model", "sim"]) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
