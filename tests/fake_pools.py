"""What every fake pool of the tests reports of its workers, the `gpu_pool.Pool` reading
half: from which workers are alive and which of them hold a batch; the deaths the core
forgave (`Pool.forgive`), the switches it asked for; and the scaling it asked for (`add`,
`retire`, `cancel_start`), each with the start the core gave it, recorded for the tests that
look, not carried out: a fake that scales overrides them."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_pool import Load, StartId, StartKind, WorkerId, WorkerInfo


class ReportsWorkers:
    """Mixed into a fake pool that says, in `holding()`, each live worker's batch or None."""

    def holding(self) -> Mapping[WorkerId, object]:
        raise NotImplementedError

    def ready_count(self) -> int:
        return len(self.holding())

    def workers(self) -> list[WorkerInfo]:
        return [WorkerInfo(w, w, None, "ready" if held is None else "busy", "cpu", 0, 0)
                for w, held in self.holding().items()]

    def state_counts(self) -> dict[str, int]:
        busy = sum(held is not None for held in self.holding().values())
        return {"ready": len(self.holding()) - busy, "busy": busy}

    def forgive(self, worker: WorkerId) -> None:
        self.__dict__.setdefault("forgiven", []).append(worker)

    def switch(self, worker: WorkerId, load: Load, start: StartId) -> None:
        self.__dict__.setdefault("switched", []).append((worker, load, start))

    def add(self, load: Load, start: StartId) -> None:
        self.__dict__.setdefault("added", []).append((load, start))

    def retire(self, worker: WorkerId) -> None:
        self.__dict__.setdefault("retired", []).append(worker)

    def start_kind(self, load: Load) -> StartKind:
        """A fake's workers are up at once, however made."""
        return StartKind.SPAWN

    def cancel_start(self, start: StartId) -> bool:
        """No start is ever pending here: a fake's workers are up at once."""
        self.__dict__.setdefault("cancelled", []).append(start)
        return False
