"""How long a cell's core takes to be ready with `--pool ray`: when it starts its actors
(each loads the model) and when it attaches to the live actors a core it replaces left
(SIGKILLed), in a Ray cluster on loopback (a head and one worker node; `measure` reruns
itself in a namespace where `lo` is the only interface, see `loadtest.netns`).

`python -m loadtest.ray_attach measure [--model sim] [--workers 2] [--rounds 3]` prints, per
round, the time from starting a core process to its pool being ready (interpreter, imports,
joining Ray and the pool's own start) and the pool's own part, first cold, then attached.

A core here is `python -m loadtest.ray_attach core ADDRESS MODEL WORKERS READY_TIMEOUT_S
ORPHAN_AFTER_S`, a process running a Ray pool as the core does, in the cell its environment
names (as a supervisor sets it). It prints one JSON line once its workers are up (the
pool's time, how many it attached and how many died meanwhile, its workers, the actors
named in its namespace), then reads commands on stdin, one a line: `send SLOT TEXT` hands
worker SLOT a batch of one input, whose answer is printed as a JSON line. End of stdin
stops the pool cleanly (its actors killed) and exits 0. The Ray tests drive it too.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import anyio

from gpu_pool import (
    CELL_ID_ENV,
    INCARNATION_ENV,
    BatchId,
    CellIdentity,
    Err,
    Ok,
    PoolSettings,
    RayPoolSettings,
    Run,
    StartId,
    StartKind,
    WorkerId,
)
from loadtest.netns import loopback_only, rerun_isolated

SLOT = "batchgate_slot"  # the custom resource each actor holds, one per worker
CORE_READY_S = 600.0  # the longest a core may take to be ready (a real model loads)


class _Printer:
    """The core's pool events: each answer a JSON line; deaths counted."""

    def __init__(self) -> None:
        self.slots: dict[WorkerId, int] = {}
        self.died = 0

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        pass

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        outputs = list(reply.outputs) if isinstance(reply, Ok) else None
        _say({"slot": self.slots.get(worker), "batch": reply.batch_id, "outputs": outputs})

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        self.died += 1


def _say(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _named_actors(namespace: str) -> dict[str, str]:
    """The live actors named in `namespace`: name to actor id."""
    import ray

    return {a["name"]: ray.get_actor(a["name"], namespace=namespace)._actor_id.hex()
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace}


async def core(
    address: str, model: str, workers: int, ready_timeout: float, orphan_after: float,
) -> None:
    """A core's stand-in: see the module's docstring."""
    from gpu_pool.ray_pool import RayPool

    cell = CellIdentity.from_env(os.environ)
    if cell is None:
        raise SystemExit(f"set {CELL_ID_ENV}")
    base = PoolSettings(model=model, workers=workers, ready_timeout=ready_timeout,
                        restart_backoff=0.05)
    pool = RayPool(RayPoolSettings(base, address=address, resources={SLOT: 1.0}, cell=cell,
                                   orphan_after=orphan_after))
    events = _Printer()
    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await pool.wait_ready(workers, within=CORE_READY_S)
        infos = pool.workers()
        events.slots = {WorkerId(w.id): w.slot for w in infos}
        _say({"ready_s": time.monotonic() - began, "attached": pool.attached,
              "died": events.died,
              "workers": [{"slot": w.slot, "pid": w.pid, "state": w.state} for w in infos],
              "actors": await anyio.to_thread.run_sync(_named_actors, cell.namespace)})
        batches = 0
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            _, slot, text = line.rstrip("\n").split(" ", 2)
            batches += 1
            pool.send(WorkerId(infos[int(slot)].id), Run(BatchId(batches), (text,)))
        tg.cancel_scope.cancel()


def core_argv(address: str, model: str, workers: int, ready_timeout: float,
              orphan_after: float = 120.0) -> list[str]:
    return [sys.executable, "-m", "loadtest.ray_attach", "core", address, model,
            str(workers), str(ready_timeout), str(orphan_after)]


def core_env(cell: str, incarnation: int) -> dict[str, str]:
    return {**os.environ, CELL_ID_ENV: cell, INCARNATION_ENV: str(incarnation)}


# -- measuring ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    total_s: float  # from starting the process to its pool being ready
    pool_s: float  # the pool's own part: joining Ray, then starting or claiming its actors
    attached: int


def _start_core(address: str, model: str, workers: int, cell: str, incarnation: int,
                log: IO[bytes]) -> tuple[subprocess.Popen[str], Start]:
    began = time.monotonic()
    proc = subprocess.Popen(core_argv(address, model, workers, CORE_READY_S),
                            env=core_env(cell, incarnation), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the core bounds its own wait (CORE_READY_S)
    if not line:
        raise RuntimeError(f"core exited with {proc.wait()} before it was ready")
    status = json.loads(line)
    start = Start(time.monotonic() - began, status["ready_s"], status["attached"])
    if status["died"] or len(status["workers"]) != workers:
        raise RuntimeError(f"core not whole: {status}")
    return proc, start


def one_round(address: str, model: str, workers: int, log: IO[bytes]) -> tuple[Start, Start]:
    """A cold core, SIGKILLed; the next core of its cell, attached, then stopped cleanly."""
    cell = f"measure-{secrets.token_hex(3)}"
    first, cold = _start_core(address, model, workers, cell, 0, log)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    second, warm = _start_core(address, model, workers, cell, 1, log)
    assert second.stdin is not None
    second.stdin.close()
    if second.wait(timeout=60) != 0 or warm.attached != workers:
        raise RuntimeError(f"the second core attached {warm.attached} of {workers}")
    return cold, warm


def measure(model: str, workers: int, rounds: int) -> list[tuple[Start, Start]]:
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join(  # the raylets' workers import this checkout
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        cluster.add_node(num_cpus=max(1, os.cpu_count() or 1), resources={SLOT: workers})
        cluster.wait_for_nodes()
        with open(os.devnull, "wb") as log:
            return [one_round(str(cluster.address), model, workers, log) for _ in range(rounds)]
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]


def report(model: str, workers: int, results: list[tuple[Start, Start]]) -> str:
    lines = [f"model {model}, {workers} workers: seconds from starting a core to its pool "
             f"being ready (total / the pool's own part)",
             f"{'round':<6} {'cold total':>11} {'cold pool':>10} {'attach total':>13} "
             f"{'attach pool':>12}"]
    for i, (cold, warm) in enumerate(results, 1):
        lines.append(f"{i:<6} {cold.total_s:>11.2f} {cold.pool_s:>10.2f} "
                     f"{warm.total_s:>13.2f} {warm.pool_s:>12.2f}")
    med = statistics.median
    lines.append(f"{'median':<6} {med(c.total_s for c, _ in results):>11.2f} "
                 f"{med(c.pool_s for c, _ in results):>10.2f} "
                 f"{med(w.total_s for _, w in results):>13.2f} "
                 f"{med(w.pool_s for _, w in results):>12.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["core"]:
        address, model, workers, ready_timeout, orphan_after = args[1:6]
        anyio.run(core, address, model, int(workers), float(ready_timeout),
                  float(orphan_after))
        return 0
    p = argparse.ArgumentParser(prog="python -m loadtest.ray_attach", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["measure"])
    p.add_argument("--model", default="sim")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(args)
    if not loopback_only():
        return rerun_isolated("loadtest.ray_attach", args)
    print(report(a.model, a.workers, measure(a.model, a.workers, a.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
