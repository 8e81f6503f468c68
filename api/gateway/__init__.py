"""A cell's gateway process: HTTP, JSON and keys, with every job sent over the link to the
core process. It loads the config, errors, http and metrics rooms, and none of the core's
packages (`failover`, `gpu_pool`): a test holds it to that.

Offers the link's frames (which the core's end in `api.cell` speaks too), the gateway's end
(`RemoteCore`, `RemoteRoute`), the process's entry point, and the lifeline every child of a
cell holds to its supervisor (the core's too).
"""

from api.gateway.frames import (
    GATEWAY_BUSY_RATE,
    GATEWAY_FRAME_SPACING_S,
    HOST_CLOCK,
    Framed,
    Message,
    outcome_message,
    outcome_of,
    run_message,
)
from api.gateway.lifeline import (
    BEAT_S,
    SILENT_S,
    CellStatus,
    ChildEnd,
    Lifeline,
    Order,
    Report,
    die_with_parent,
    name_process,
    prctl,
)
from api.gateway.main import GatewayServer, connections_file, gateway_main
from api.gateway.remote import (
    BACKSTOP_MARGIN_S,
    CALL_TIMEOUT_S,
    Receiver,
    RemoteCore,
    RemoteRoute,
    client_closed,
    unavailable,
    unresponsive,
)

__all__ = [
    "BACKSTOP_MARGIN_S",
    "BEAT_S",
    "CALL_TIMEOUT_S",
    "GATEWAY_BUSY_RATE",
    "GATEWAY_FRAME_SPACING_S",
    "HOST_CLOCK",
    "SILENT_S",
    "CellStatus",
    "ChildEnd",
    "Framed",
    "GatewayServer",
    "Lifeline",
    "Message",
    "Order",
    "Receiver",
    "RemoteCore",
    "RemoteRoute",
    "Report",
    "client_closed",
    "connections_file",
    "die_with_parent",
    "gateway_main",
    "name_process",
    "outcome_message",
    "outcome_of",
    "prctl",
    "run_message",
    "unavailable",
    "unresponsive",
]
