"""A cell on one host (`--gateways K`): a supervisor that keeps the core process and the
gateway processes (each a `Child`: spawned with its lifeline, restarted, stopped), the core
process itself, and the core's end of the link that serves the gateways' jobs through the
one door."""

from api.cell.channel import Channel
from api.cell.child import Child, ChildState, Keeping
from api.cell.core import CORE_NAME, CoreTarget, core_main
from api.cell.gateways import STOP_GRACE_S, Gateways, GatewayTarget
from api.cell.link import DEADLINE_SLOT_S, LinkServer
from api.cell.scratch import (
    RETIRED,
    SCRATCH_PREFIX,
    bind,
    multiprocess_metrics,
    retire_metrics,
    sweep_scratch,
)
from api.cell.supervisor import (
    CORE_KEEPING,
    become_subreaper,
    core_process,
    end_orphans,
    serve_cell,
)

__all__ = [
    "CORE_KEEPING",
    "CORE_NAME",
    "DEADLINE_SLOT_S",
    "RETIRED",
    "SCRATCH_PREFIX",
    "STOP_GRACE_S",
    "Channel",
    "Child",
    "ChildState",
    "CoreTarget",
    "GatewayTarget",
    "Gateways",
    "Keeping",
    "LinkServer",
    "become_subreaper",
    "bind",
    "core_main",
    "core_process",
    "end_orphans",
    "multiprocess_metrics",
    "retire_metrics",
    "serve_cell",
    "sweep_scratch",
]
