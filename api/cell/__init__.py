"""A cell on one host (`--gateways K`): a supervisor that starts and restarts the core
process and the gateway processes, the core process itself, and the core's end of the link
that serves the gateways' jobs through the one door."""

from api.cell.core import CORE_NAME, DRAIN_SIGNAL, LEAVE_SIGNAL, core_main, read_status
from api.cell.gateways import STOP_GRACE_S, Gateways, GatewayState
from api.cell.link import DEADLINE_SLOT_S, LinkServer
from api.cell.scratch import (
    RETIRED,
    SCRATCH_PREFIX,
    bind,
    multiprocess_metrics,
    retire_metrics,
    sweep_scratch,
)
from api.cell.supervisor import CoreProcess, end_orphans, serve_cell

__all__ = [
    "CORE_NAME",
    "DEADLINE_SLOT_S",
    "DRAIN_SIGNAL",
    "LEAVE_SIGNAL",
    "RETIRED",
    "SCRATCH_PREFIX",
    "STOP_GRACE_S",
    "CoreProcess",
    "GatewayState",
    "Gateways",
    "LinkServer",
    "bind",
    "core_main",
    "end_orphans",
    "multiprocess_metrics",
    "read_status",
    "retire_metrics",
    "serve_cell",
    "sweep_scratch",
]
