"""`--state`: where kept answers live, read once into a frozen record that everyone reads
(`Settings.state_spec()`): the idempotency store's durable layer, and with Redis the rate
limits cells share (no other reading of the text exists). Reading it touches nothing:
whether a SQLite file's folder exists is checked at the edge, and nothing connects until
the service runs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

STATE_FORMS = "memory, sqlite:PATH or redis://HOST:PORT/DB"


class StateKind(StrEnum):
    MEMORY = "memory"  # this process's memory alone
    SQLITE = "sqlite"  # an embedded file: outlives the core and the server
    REDIS = "redis"  # a server that cells share (kept answers and rate limits)


@dataclass(frozen=True, slots=True)
class StateSpec:
    """`--state` read: `memory`, `sqlite` (`path`), or `redis` (`host`, `port`, `db`)."""

    kind: StateKind
    path: Path | None = None
    host: str = ""
    port: int = 0
    db: int = 0


@lru_cache(maxsize=64)
def parse_state(text: str) -> StateSpec:
    """The one reading of `--state`, made once per text (the settings' check reads it, and
    whoever asks later gets the same record); ValueError naming the forms it takes."""
    if text == "memory":
        return StateSpec(StateKind.MEMORY)
    if text.startswith("sqlite:"):
        path = Path(text.removeprefix("sqlite:")).expanduser()
        if not str(path) or str(path) == "." or text.endswith("/"):
            raise ValueError(f"state sqlite:PATH needs a file's path, got {text!r}")
        return StateSpec(StateKind.SQLITE, path=path)
    if text.startswith("redis://"):
        url = urlsplit(text)
        try:
            port, db = url.port or 6379, int(url.path.strip("/") or 0)
        except ValueError:
            port = db = -1
        if not url.hostname or port < 1 or db < 0 or url.query or url.fragment \
                or url.username or url.password:
            raise ValueError(f"state must be redis://HOST:PORT/DB (DB a number), got {text!r}")
        return StateSpec(StateKind.REDIS, host=url.hostname, port=port, db=db)
    raise ValueError(f"state must be {STATE_FORMS}, got {text!r}")


__all__ = ["STATE_FORMS", "StateKind", "StateSpec", "parse_state"]
