"""What the status endpoints show of the core process: readiness, the workers, the metrics,
and in a cell the processes around it (none in a single process). `StatusView.table` is
every status call's handler (`api.http.StatusCall`), answered from it in process
(`LocalCore`) and across a cell's link (`api.cell.LinkServer`) alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from api.door.models import ModelsAdmin
from api.http import StatusCall, StatusTable
from api.metrics import Metrics
from failover.fleet import CapacityGauges
from gpu_pool import WorkerInfo


class Running(Protocol):
    """What is read of the running service (`api.door.Service`)."""

    @property
    def draining(self) -> bool: ...

    @property
    def leaving(self) -> bool: ...

    def ready(self) -> bool: ...

    def state_failing(self) -> str | None: ...

    def workers(self) -> list[WorkerInfo]: ...

    def capacity(self) -> CapacityGauges | None: ...


class StreamCalls(Protocol):
    """A streamed request's start (called) and end (`api.door.StreamStart`)."""

    async def __call__(self, *args: Any) -> Any: ...

    async def ended(self, stream: str) -> None: ...


class StatusView:
    def __init__(self, service: Running, ready_count: Callable[[], int], metrics: Metrics,
                 cell: Callable[[], dict[str, Any]] | None = None,
                 models: ModelsAdmin | None = None,
                 stream: StreamCalls | None = None) -> None:
        """`stream`: the door's start and end of a streamed request
        (`api.door.StreamStart`)."""
        self._service, self._ready_count = service, ready_count
        self._metrics, self._cell, self._models = metrics, cell, models
        self.table: StatusTable = {
            StatusCall.READY: self.ready, StatusCall.WORKERS: self.workers,
            StatusCall.CAPACITY: self.capacity, StatusCall.MODELS: self.models,
            StatusCall.CELL: self.cell, StatusCall.METRICS_TEXT: self.metrics_text,
        }
        if stream is not None:
            self.table = {**self.table, StatusCall.STREAM: stream,
                          StatusCall.STREAM_END: stream.ended}

    async def ready(self) -> dict[str, object]:
        """Ready while some model can serve (`Service.ready`); each version's state beside
        it, and why the `--state` store fails if it does (keyed requests are refused then,
        the rest are served: still ready)."""
        service = self._service
        body: dict[str, object] = {"ready": service.ready(), "workers_ready": self._ready_count(),
                                   "draining": service.draining or service.leaving}
        if self._models is not None:
            body["models"] = self._models.states()
        failing = service.state_failing()
        if failing is not None:
            body["state"] = f"failing: {failing}"
        return body

    async def models(self, method: str, name: str | None, version: str | None,
                     body: bytes) -> tuple[int, dict[str, Any]]:
        """The admin API of the catalogue (`api.door.models`)."""
        assert self._models is not None, "no catalogue is served here"
        return self._models.call(method, name, version, body)

    async def workers(self) -> list[dict[str, Any]]:
        """Plain records: they cross the link to gateways, which never load the pool."""
        return [asdict(w) for w in self._service.workers()]

    async def capacity(self) -> tuple[int, int, int] | None:
        """(desired, starting, running) as the scaling rule sees them; None: a fixed pool."""
        gauges = self._service.capacity()
        return None if gauges is None else (gauges.desired, gauges.starting, gauges.running)

    async def metrics_text(self) -> bytes:
        return self._metrics.render()

    async def cell(self) -> dict[str, Any]:
        """The gateway processes and the core process as the cell's supervisor last said:
        `{"gateways": [...], "core": {...}}`; none of either in a single process."""
        cell = self._cell() if self._cell is not None else {}
        return {"gateways": list(cell.get("gateways", [])), "core": cell.get("core")}


__all__ = ["Running", "StatusView"]
