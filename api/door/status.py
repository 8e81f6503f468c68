"""What the status endpoints show of the core process: readiness, the workers, the metrics,
and the gateways in front of it (none in a single process)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from api.metrics import Metrics
from gpu_pool import WorkerInfo


class Running(Protocol):
    """What is read of the running service (`api.door.Service`)."""

    @property
    def draining(self) -> bool: ...

    @property
    def leaving(self) -> bool: ...

    def ready(self) -> bool: ...

    def workers(self) -> list[WorkerInfo]: ...


class StatusView:
    def __init__(self, service: Running, ready_count: Callable[[], int], metrics: Metrics,
                 gateways: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self._service, self._ready_count = service, ready_count
        self._metrics, self._gateways = metrics, gateways

    async def ready(self) -> dict[str, object]:
        service = self._service
        return {"ready": service.ready(), "workers_ready": self._ready_count(),
                "draining": service.draining or service.leaving}

    async def workers(self) -> list[dict[str, Any]]:
        """Plain records: they cross the link to gateways, which never load the pool."""
        return [asdict(w) for w in self._service.workers()]

    async def metrics_text(self) -> bytes:
        return self._metrics.render()

    async def gateways(self) -> list[dict[str, Any]]:
        return self._gateways() if self._gateways is not None else []


__all__ = ["Running", "StatusView"]
