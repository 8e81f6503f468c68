"""A cell on one host (`--gateways K`): the core process, the gateway processes it spawns and
restarts, and the core's end of the link that serves their jobs through the one door."""

from api.cell.core import serve_cell
from api.cell.link import DEADLINE_SLOT_S, LinkServer
from api.cell.supervisor import (
    SCRATCH_PREFIX,
    Gateways,
    GatewayState,
    bind,
    multiprocess_metrics,
    sweep_scratch,
)

__all__ = [
    "DEADLINE_SLOT_S",
    "SCRATCH_PREFIX",
    "GatewayState",
    "Gateways",
    "LinkServer",
    "bind",
    "multiprocess_metrics",
    "serve_cell",
    "sweep_scratch",
]
