"""A Ray cluster on loopback for the tests: a head and two worker nodes of two worker slots
each, and what the tests do to it and read from a server using it.

The head holds no slot, so every actor lands on a worker node. Nodes are declared dead
after ~1.5 s of silence (Ray's default is about 15 s), so a lost node is seen in a test's
time; the server's own hang watchdog would catch it within `--hang-timeout-ms` anyway.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import ray
from ray.cluster_utils import Cluster

from tests.e2e.helpers import EXAMPLE_KEYS

SLOT = "batchgate_slot"  # the custom resource each worker actor holds
SLOTS_PER_NODE = 2
SLOW_LOAD_S = 3.0  # how long `tests.ray.slow_load`'s model takes to load
ROOT = Path(__file__).parents[2]
ADMIN = {"Authorization": "Bearer admin-demo-key"}
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
Worker = dict[str, Any]  # one entry of /admin/workers


class Lab:
    """The cluster, joined by this process (to kill actors as an operator would)."""

    def __init__(self, worker_nodes: int = 2) -> None:
        # Ray's workers are started by the raylets: they must find this checkout (and
        # tests.models); and a token in the environment spares ~/.ray/auth_token.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
        os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "100")  # a traced actor's spans: 0.1 s
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "_system_config": FAST_NODE_DEATH})
        self._nodes: dict[str, Any] = {}
        self.size = worker_nodes  # what every test starts with
        for _ in range(worker_nodes):
            self.add_node()
        ray.init(address=self.cluster.address)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def worker_nodes(self) -> list[str]:
        return list(self._nodes)

    def add_node(self) -> str:
        node = self.cluster.add_node(num_cpus=1, resources={SLOT: SLOTS_PER_NODE})
        self.cluster.wait_for_nodes()
        self._nodes[node.node_id] = node
        return str(node.node_id)

    def remove_node(self, node_id: str) -> None:
        """Lose a node as a machine is lost: its raylet and workers killed, no goodbye."""
        self.cluster.remove_node(self._nodes.pop(node_id), allow_graceful=False)

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()  # type: ignore[no-untyped-call]

    def serve_args(self) -> list[str]:
        """`batchgate serve` flags for a server whose workers live in this cluster."""
        return ["--pool", "ray", "--ray-address", self.address,
                "--ray-worker-resources", SLOT]

    def serve_models(self, folder: Path, catalogue: str) -> list[str]:
        """The flags for a server in this cluster serving `catalogue` (a models file's text,
        written into `folder`) with the example keys."""
        models = folder / "models.toml"
        models.write_text(catalogue)
        return [*self.serve_args(), "--keys", str(EXAMPLE_KEYS), "--models", str(models)]


def kill_actor(pid: int) -> None:
    """`ray.kill` the live actor whose process is `pid`, as an operator would."""
    ray.kill(actor_of(pid))


def actor_of(pid: int) -> Any:
    """The handle of the live actor whose process is `pid`, found by its name."""
    (actor_id, name), = [(k, a["Name"]) for k, a in ray._private.state.actors().items()
                         if a["Pid"] == pid and a["State"] == "ALIVE"]
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"] == name:  # the same name may be in several namespaces
            actor = ray.get_actor(name, namespace=entry["namespace"])
            if actor._actor_id.hex() == actor_id:
                return actor
    raise LookupError(f"no named actor with pid {pid}")


def up(workers: list[Worker]) -> list[Worker]:
    return [w for w in workers if w["state"] in ("ready", "busy")]


def in_state(workers: list[Worker], state: str) -> list[Worker]:
    return [w for w in workers if w["state"] == state]


async def wait_workers(
    url: str, condition: Callable[[list[Worker]], bool], within: float = 60.0,
) -> list[Worker]:
    """Poll the server's /admin/workers (another process) until `condition` holds."""
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as client:
        with anyio.fail_after(within):
            while True:
                workers: list[Worker] = (await client.get("/admin/workers")).json()["workers"]
                if condition(workers):
                    return workers
                await anyio.sleep(0.02)
