"""What the Ray pool asks of the cluster itself, apart from its actors: whether the head is
reachable at all, and which nodes are lost. Blocking calls: run them in a thread.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError

CONNECT_TIMEOUT_S = 10.0  # to open a TCP connection to the head's address
RAYLET_KNOCK_S = 0.5  # to connect to a dead actor's raylet; no answer in time proves nothing
_GONE = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})
_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes  # Ray leaves it unannotated


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


__all__ = ["check_reachable", "lost_nodes"]
