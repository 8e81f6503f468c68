"""`batchgate serve`'s flags, derived from the `Settings` fields: one flag and one
`BATCHGATE_<NAME>` variable per field, the help and default from the field's metadata.

A flag wins over its variable; a bad value in either is one line on stderr and exit 2. A
secret (the admin key) has its variable only: `ps` shows every process's command line.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import MISSING, Field, dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

from api.config.settings import Settings, parse_bool

ENV_PREFIX = "BATCHGATE_"
MASK = "********"


@dataclass(frozen=True, slots=True)
class Knob:
    """One setting as the command line sees it."""

    name: str  # the Settings field
    parse: Callable[[str], Any]
    help: str
    default: object
    shown: str  # the default as a person reads it
    secret: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def takes_flag(self) -> bool:
        return not self.secret

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def knobs() -> Iterator[Knob]:
    hints = typing.get_type_hints(Settings)
    for f in fields(Settings):
        meta = f.metadata
        parse = meta.get("parse") or _parser_for(hints[f.name])
        shown = meta.get("shown") or _show(f)
        yield Knob(f.name, parse, meta["help"], f.default, shown, bool(meta.get("secret")))


def forget_secrets(env: MutableMapping[str, str]) -> None:
    """Drop the secret settings' variables once read: every worker and gateway process is
    spawned with this process's environment, readable in its /proc/<pid>/environ."""
    for knob in knobs():
        if knob.secret:
            env.pop(knob.env, None)


def _parser_for(kind: Any) -> Callable[[str], Any]:
    """The parser for an annotation: `X | None` parses as X (None is the unset default)."""
    if isinstance(kind, types.UnionType):
        (kind,) = [k for k in typing.get_args(kind) if k is not type(None)]
    if kind is bool:
        return parse_bool
    if kind in (int, float, str, Path):
        return typing.cast(Callable[[str], Any], kind)
    raise TypeError(f"no flag parser for {kind!r}: give the field a parse= in its knob()")


def _show(f: Field[Any]) -> str:
    value = f.default
    if value is MISSING:
        raise TypeError(f"setting {f.name} has no default")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) and value >= 10_000 else str(value)


class Parser(argparse.ArgumentParser):
    """Errors as one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_settings_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """One flag per setting; a set `BATCHGATE_<NAME>` becomes the flag's default. A secret's
    flag is refused with a message that names its variable."""
    for k in knobs():
        if k.takes_flag:
            parser.add_argument(k.flag, type=_typed(k), default=None, metavar=k.name.upper(),
                                help=f"{k.help} (default {k.shown}) [env {k.env}]")
        else:
            parser.add_argument(k.flag, action=_Refused, env=k.env, dest=k.name, default=None,
                                help=argparse.SUPPRESS)
        if k.env in env:
            parser.set_defaults(**{k.name: _from_env(k, env[k.env], parser)})


class _Refused(argparse.Action):
    """A secret given as a flag: refused, since any user can read it in `ps`."""

    def __init__(self, option_strings: list[str], dest: str, env: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", **kwargs)
        self.env = env

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is not taken on the command line, where ps shows it: "
                     f"set {self.env}, or list the key in the keys file")


def _typed(k: Knob) -> Callable[[str], Any]:
    """argparse shows a ValueError from `type` as 'invalid <name> value'; keep our message."""

    def parse(text: str) -> Any:
        try:
            return k.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid value ({exc})") from None

    parse.__name__ = k.name
    return parse


def _from_env(k: Knob, value: str, parser: argparse.ArgumentParser) -> Any:
    try:
        return k.parse(value)
    except ValueError:
        parser.error(f"{k.env}={value!r} is not a valid value")


def settings_from(args: argparse.Namespace) -> Settings:
    names = {f.name for f in fields(Settings)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return Settings(**given)


def describe(settings: Settings, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The effective configuration, one `name = value  # source` line each, secrets masked."""
    lines = []
    for k in knobs():
        value = getattr(settings, k.name)
        if k.secret and value is not None:
            value = MASK
        flagged = k.takes_flag and any(a == k.flag or a.startswith(k.flag + "=") for a in argv)
        source = "flag" if flagged else "env" if k.env in env else "default"
        lines.append(f"{k.name} = {'' if value is None else value}  # {source}")
    return "\n".join(lines)


def markdown_table() -> str:
    """The configuration table of docs/operations.md."""
    rows = ["| flag | variable | default | meaning |", "|---|---|---|---|"]
    rows += [f"| {f'`{k.flag}`' if k.takes_flag else '(variable only)'} | `{k.env}` | "
             f"{k.shown} | {k.help} |" for k in knobs()]
    return "\n".join(rows)


__all__ = ["ENV_PREFIX", "MASK", "Knob", "Parser", "add_settings_flags", "describe",
           "forget_secrets", "knobs", "markdown_table", "settings_from"]
