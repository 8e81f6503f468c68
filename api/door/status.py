"""What the status endpoints show of the core process: readiness, the workers, the metrics,
and in a cell the processes around it (none in a single process)."""

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
                 cell: Callable[[], dict[str, Any]] | None = None) -> None:
        self._service, self._ready_count = service, ready_count
        self._metrics, self._cell = metrics, cell

    async def ready(self) -> dict[str, object]:
        service = self._service
        return {"ready": service.ready(), "workers_ready": self._ready_count(),
                "draining": service.draining or service.leaving}

    async def workers(self) -> list[dict[str, Any]]:
        """Plain records: they cross the link to gateways, which never load the pool."""
        return [asdict(w) for w in self._service.workers()]

    async def metrics_text(self) -> bytes:
        return self._metrics.render()

    async def cell(self) -> dict[str, Any]:
        """The gateway processes and the core process as the cell's supervisor last said:
        `{"gateways": [...], "core": {...}}`; none of either in a single process."""
        cell = self._cell() if self._cell is not None else {}
        return {"gateways": list(cell.get("gateways", [])), "core": cell.get("core")}


__all__ = ["Running", "StatusView"]
