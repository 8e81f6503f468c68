"""What the Open Inference Protocol's health and metadata calls answer, from the core's one
readiness call (`StatusCall.READY`): the same on the HTTP and gRPC sides.

A model is named as the catalogue names it (`SINGLE_MODEL` for `--model SPEC`); its versions
are its live ones. A version is ready while a worker holds it (`resident`): a cold one is
served too, but only after a load, which a client asking "ready?" means to avoid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.http import Routes, StatusCall
from api.oip.infer import SINGLE_MODEL

SERVER = "batchgate"
PLATFORM = "batchgate_batchstring"
INPUT, OUTPUT, REFUSED = "INPUT", "OUTPUT", "REFUSED"
"""The tensors: one BYTES input of shape [n] (or [n, 1]); one BYTES output in the same
order; REFUSED beside it, "guard:reason" per input, when a guard refused some input."""
READY = "resident"


@dataclass(frozen=True, slots=True)
class ModelView:
    name: str
    versions: dict[str, str]  # live version -> its state (`failover.fleet.VersionStatus`)

    def ready(self, version: str | None = None) -> bool:
        """Whether `version` (None: any) can answer without a load first."""
        if version is not None:
            return self.versions.get(version) == READY
        return READY in self.versions.values()


async def server_ready(routes: Routes) -> bool:
    body = await routes.core.status(StatusCall.READY)
    return bool(body["ready"])


async def model_view(routes: Routes, name: str) -> ModelView | None:
    """`name`'s live versions and their states; None: no such model is served."""
    body: dict[str, Any] = await routes.core.status(StatusCall.READY)
    states: dict[str, str] | None = body.get("models")
    if states is None:  # a core without a catalogue: one model, ready as the server is
        if name != SINGLE_MODEL:
            return None
        return ModelView(name, {"v1": READY if body["ready"] else "loading"})
    versions = {key.partition("@")[2]: state for key, state in states.items()
                if key.partition("@")[0] == name and state != "retired"}
    return ModelView(name, versions) if versions else None


__all__ = ["INPUT", "OUTPUT", "PLATFORM", "REFUSED", "SERVER", "ModelView", "model_view",
           "server_ready"]
