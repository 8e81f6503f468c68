"""What the Ray pool asks of the cluster itself, apart from driving its actors: to join it
(whether its head is reachable at all) and leave it, how many workers its nodes hold, which
nodes are lost, and to kill actors. Ray's driver changes this process's signal handlers when
it connects or disconnects; they are put back (`gpu_pool.signal_guard`). Blocking calls: run
them in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray.exceptions import RayError

from gpu_pool.ray_settings import RayPoolSettings
from gpu_pool.signal_guard import signals_kept

CONNECT_TIMEOUT_S = 10.0  # to open a TCP connection to the head's address
RAYLET_KNOCK_S = 0.5  # to connect to a dead actor's raylet; no answer in time proves nothing
_GONE = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})
_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes  # Ray leaves these unannotated
_resources: Callable[[], dict[str, float]] = ray.cluster_resources


def join(settings: RayPoolSettings, namespace: str) -> None:
    """Connect this process to the pool's cluster, or start a local Ray for the pool."""
    if settings.address is not None:
        check_reachable(settings.address)
    with signals_kept():
        if settings.address is None:
            ray.init(address="local", resources=settings.local_resources(),
                     namespace=namespace, include_dashboard=False)
        else:
            ray.init(address=settings.address, namespace=namespace)


def leave() -> None:
    """Disconnect this process from Ray (stopping the local Ray `join` started)."""
    with signals_kept():
        ray.shutdown()


def kill_actors(actors: Iterable[Any]) -> None:
    """`ray.kill` each actor; one already gone is no error."""
    for actor in actors:
        with contextlib.suppress(RayError, ValueError):
            ray.kill(actor)


def capacity(resources: dict[str, float]) -> int:
    """How many workers, each holding `resources`, the cluster's nodes hold all together."""
    total = _resources()
    return min(int(total.get(k, 0.0) // v) for k, v in resources.items())


def lost_nodes(suspects: set[str]) -> set[str]:
    """The ids of the nodes Ray has declared dead, and of the `suspects` whose raylet
    refuses a connection: a lost machine is known before Ray's verdict on it, which comes
    only after several missed health checks (blocking: call it in a thread)."""
    try:
        nodes = _nodes()
    except RayError:
        return set()
    lost = {n["NodeID"] for n in nodes if not n["Alive"]}
    for node in nodes:
        if node["Alive"] and node["NodeID"] in suspects and not _answers(
                node["NodeManagerAddress"], node["NodeManagerPort"]):
            lost.add(node["NodeID"])
    return lost


def _answers(host: str, port: int) -> bool:
    """False only when the address says for sure that nothing listens there."""
    try:
        with socket.create_connection((host, port), timeout=RAYLET_KNOCK_S):
            return True
    except OSError as exc:
        return exc.errno not in _GONE


def check_reachable(address: str) -> None:
    """Fail in seconds on a head that is not there: ray.init retries a refused address for
    about 13 minutes (measured) before it gives up."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # not host:port ("auto", a Ray Client address): Ray's own checks apply
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConnectionError(f"cannot reach the Ray cluster at {address}: {exc}") from exc


__all__ = ["capacity", "check_reachable", "join", "kill_actors", "leave", "lost_nodes"]
