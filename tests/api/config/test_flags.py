"""One source of configuration: every setting is one flag and one variable, derived from
the `Settings` fields, and the effective configuration can be printed with secrets masked."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from api.cli import build_parser, main
from api.config import MASK, Settings, knobs, markdown_table, parse_bool, settings_from

OPERATIONS = Path(__file__).parents[3] / "docs" / "operations.md"


def serve_parser(env: dict[str, str]) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser(env)._actions
               if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_setting_has_exactly_one_flag() -> None:
    flags = [o for a in serve_parser({})._actions for o in a.option_strings]
    expected = ["--" + f.name.replace("_", "-") for f in fields(Settings)]
    assert sorted(flags) == sorted([*expected, "-h", "--help", "--print-config"])


def test_a_secret_is_refused_on_the_command_line_and_its_variable_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--admin-key", "s3cret"], ["--admin-key=s3cret"]):
        with pytest.raises(SystemExit) as exited:
            build_parser({}).parse_args(["serve", *argv])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "BATCHGATE_ADMIN_KEY" in err and "s3cret" not in err
    assert "--admin-key" not in serve_parser({}).format_help()


def test_every_setting_has_exactly_one_variable_and_it_sets_that_setting() -> None:
    for k in knobs():
        sample = "7" if k.parse is not parse_bool else "false"
        args = serve_parser({k.env: sample}).parse_args([])
        assert getattr(args, k.name) == k.parse(sample), k.env
        others = {n: v for n, v in vars(args).items() if n != k.name and v is not None}
        assert others == {"print_config": False}, k.env


def test_a_flag_wins_over_its_variable() -> None:
    args = build_parser({"BATCHGATE_GPUS": "2"}).parse_args(["serve", "--gpus", "0"])
    assert settings_from(args).gpus == 0


def test_gateways_accepts_auto() -> None:
    args = build_parser({}).parse_args(["serve", "--gateways", "auto"])
    assert settings_from(args).gateways >= 1


def test_print_config_masks_the_admin_key_and_names_each_source(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHGATE_WORKERS", "3")
    monkeypatch.setenv("BATCHGATE_ADMIN_KEY", "s3cret")
    assert main(["serve", "--print-config", "--model", "sim"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and f"admin_key = {MASK}  # env" in out
    assert "workers = 3  # env" in out and "port = 8000  # default" in out
    assert len(out.splitlines()) == len(fields(Settings))


def test_readme_holds_the_generated_configuration_table() -> None:
    assert markdown_table() in OPERATIONS.read_text()
