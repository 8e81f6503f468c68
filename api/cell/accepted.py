"""The models and keys files a cell serves: the last of each that was accepted, kept by the
supervisor.

The supervisor is the one reader of the operator's files. At start and at each SIGHUP it
reads each file, checks it as the core (the models) and the gateways (the keys) would, and
only if it passes keeps a copy in the cell's scratch folder; the core and the gateways read
these copies alone (their settings name them). A file that is broken on disk is refused
there, logged, and shown on `/admin/models`, and the cell goes on with the copy it has. So
a core or gateway that dies starts again from what was last accepted, where it would read
the broken file, exit at start, and be restarted into the same failure on a growing
backoff, the whole cell out of service until someone fixed the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.config import Settings, load_keys
from api.door import check_core_settings

log = logging.getLogger("batchgate.cell")

ACCEPTED = "accepted"  # the folder of the copies, in the cell's scratch folder


@dataclass(frozen=True, slots=True)
class Refusal:
    """A file on disk that was not accepted: the copy before it is served instead."""

    file: str
    reason: str

    def shown(self) -> dict[str, Any]:
        return {"file": self.file, "reason": self.reason}


class Accepted:
    """The kept copies of `settings.models` and `settings.keys` in `folder`."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._settings, self._folder = settings, folder
        self.refused: tuple[Refusal, ...] = ()

    def settings(self) -> Settings:
        """The settings the cell's children get: each file named is its kept copy."""
        settings, folder = self._settings, self._folder
        return dataclasses.replace(
            settings,
            models=None if settings.models is None else str(folder / "models.toml"),
            keys=None if settings.keys is None else folder / "keys.toml")

    def read(self) -> bool:
        """Read both files again; each that passes replaces its copy, each that does not
        is refused (`refused`) and its copy stays. Whether every file was accepted."""
        settings, refused = self._settings, []
        checks: list[tuple[str | Path | None, str, Callable[[Path], object]]] = [
            (settings.models, "models.toml",
             lambda p: check_core_settings(dataclasses.replace(settings, models=str(p)))),
            (settings.keys, "keys.toml", lambda p: load_keys(p, settings.admin_key)),
        ]
        for source, name, check in checks:
            if source is None:
                continue
            reason = self._take(Path(source), self._folder / name, check)
            if reason is not None:
                refused.append(Refusal(str(source), reason))
        self.refused = tuple(refused)
        return not refused

    def _take(self, source: Path, kept: Path, check: Callable[[Path], object]) -> str | None:
        """Copy `source` over `kept` if its bytes pass `check`; else why not."""
        new = kept.with_name(kept.name + ".new")
        try:
            data = source.read_bytes()
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # keys inside
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            check(new)  # the very bytes that are kept, whatever the file holds by now
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                new.unlink()
            reason = str(exc).replace(str(new), str(source))
            log.error("%s is refused; the cell serves the copy accepted before it: %s",
                      source, reason)
            return reason
        os.replace(new, kept)
        return None


__all__ = ["ACCEPTED", "Accepted", "Refusal"]
