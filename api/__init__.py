"""The front door, in rooms whose arrows run one way:

    cli ──> cell ──> door ──> http ──> config ──> errors
             └────> gateway ──┘  (door, http, gateway ──> metrics)

- `api.config`: settings, flags and variables, keys files, tiers (a leaf but for errors);
- `api.errors`: the one error tree and every HTTP status;
- `api.metrics`: the Prometheus names;
- `api.http`: the protocol, the routes, parsing, OpenAPI, the access log, the server;
- `api.door`: the door, the keyed path, the service that builds the core, the local route;
- `api.gateway`: a cell's gateway process and the link's frames (no core loaded);
- `api.cell`: the core process of a cell, its gateways and the link's core end;
- `api.plan`, `api.cli`, and `api.stopped` (Ctrl-C before a server takes it; the entry,
  `api.__main__.main`, installs it first).

The Python client lives in api/client/ but is no room of api: it is a distribution of its
own (`batchgate_client`, httpx and the standard library only), which never installs the server.
Importing `api` loads nothing, and every room says what it offers in its own `__init__`.
"""

__all__: list[str] = []
