"""The HTTP side of the front door: the protocol and its limits, the direct way's HTTP half,
the ASGI routes, request parsing, the jobs a route hands the core and what comes back,
OpenAPI, the access log, draining, and the uvicorn server built in one place.

It never imports the door or the cell (a test holds it to that): what it needs of the core
is a `CoreView` and a `DirectRoute` subclass, given to it by whoever builds the server.
"""

from api.http.access_log import (
    AccessLog,
    Served,
    hot,
)
from api.http.app import (
    GC_THRESHOLDS,
    Lifespan,
    http_app,
    on_sighup,
    server_config,
    settle_and_time,
    settle_heap,
)
from api.http.calls import (
    StatusCall,
    StatusHandler,
    StatusTable,
    answer,
)
from api.http.collation import (
    CONNECTION,
    QUIET,
    ClientWatch,
    Collation,
    Deadlines,
    PendingRequest,
    ReceiveWatch,
    TurnEnds,
)
from api.http.connections import (
    CellConnections,
    Connections,
    ConnectionTally,
    LocalConnections,
)
from api.http.direct import (
    V1,
    Connection,
    DirectCall,
    DirectRoute,
    Shape,
)
from api.http.draining import (
    DrainingServer,
)
from api.http.fastpath import (
    HOT_PATH,
    HttpCall,
    JsonAnswer,
    RawCall,
    header_map,
    with_fast_path,
)
from api.http.jobs import (
    GUARD_SKIPPED,
    Answered,
    Job,
    Outcome,
    Refusals,
    Rendered,
    all_refused,
    answer_body,
    answer_id,
    guarded_answer,
    rendered,
)
from api.http.media import (
    Framing,
    framing_of,
)
from api.http.openapi import (
    ADMIN_ONLY,
    DocumentedRoute,
    document,
    openapi_routes,
)
from api.http.parsing import (
    MIN_TIMEOUT_MS,
    MODEL_NAME,
    Limits,
    ParsedRequest,
    parse_body,
    parse_timeout,
)
from api.http.protocol import (
    HOT_URL,
    ConnectionLimits,
    Departure,
    GuardedHttpProtocol,
    guarded_protocol,
)
from api.http.routes import (
    IDEMPOTENCY_KEY,
    MAX_IDEMPOTENCY_KEY,
    CoreView,
    Routes,
    read_body,
    render,
    trace_job,
)

__all__ = [
    "ADMIN_ONLY",
    "CONNECTION",
    "GC_THRESHOLDS",
    "GUARD_SKIPPED",
    "HOT_PATH",
    "HOT_URL",
    "IDEMPOTENCY_KEY",
    "MAX_IDEMPOTENCY_KEY",
    "MIN_TIMEOUT_MS",
    "MODEL_NAME",
    "QUIET",
    "V1",
    "AccessLog",
    "Answered",
    "CellConnections",
    "ClientWatch",
    "Collation",
    "Connection",
    "ConnectionLimits",
    "ConnectionTally",
    "Connections",
    "CoreView",
    "Deadlines",
    "Departure",
    "DirectCall",
    "DirectRoute",
    "DocumentedRoute",
    "DrainingServer",
    "Framing",
    "GuardedHttpProtocol",
    "HttpCall",
    "Job",
    "JsonAnswer",
    "Lifespan",
    "Limits",
    "LocalConnections",
    "Outcome",
    "ParsedRequest",
    "PendingRequest",
    "RawCall",
    "ReceiveWatch",
    "Refusals",
    "Rendered",
    "Routes",
    "Served",
    "Shape",
    "StatusCall",
    "StatusHandler",
    "StatusTable",
    "TurnEnds",
    "all_refused",
    "answer",
    "answer_body",
    "answer_id",
    "document",
    "framing_of",
    "guarded_answer",
    "guarded_protocol",
    "header_map",
    "hot",
    "http_app",
    "on_sighup",
    "openapi_routes",
    "parse_body",
    "parse_timeout",
    "read_body",
    "render",
    "rendered",
    "server_config",
    "settle_and_time",
    "settle_heap",
    "trace_job",
    "with_fast_path",
]
