"""`batchgate serve` and `batchgate plan`: flags, each also read from `BATCHGATE_<NAME>`.

A bad value is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from api.settings import Settings

PROG = "batchgate"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add(
    parser: argparse.ArgumentParser, name: str, kind: Callable[[str], Any], help: str,
    env: dict[str, str],
) -> None:
    flag = "--" + name
    var = "BATCHGATE_" + name.upper().replace("-", "_")
    default = env.get(var)
    parser.add_argument(flag, type=kind, default=None, help=f"{help} [env {var}]")
    if default is not None:
        parser.set_defaults(**{name.replace("-", "_"): _from_env(kind, default, var, parser)})


def _from_env(
    kind: Callable[[str], Any], value: str, var: str, parser: argparse.ArgumentParser
) -> Any:
    try:
        return kind(value)
    except (ValueError, argparse.ArgumentTypeError):
        parser.error(f"{var}={value!r} is not a valid value")


SERVE_FLAGS: list[tuple[str, Callable[[str], Any], str]] = [
    ("host", str, "address to bind (default 127.0.0.1)"),
    ("port", int, "port to bind (default 8000)"),
    ("model", str, "minilm (default), sim, or module:function naming a batchstring"),
    ("workers", int, "worker processes, one per GPU (default 1)"),
    ("max-batch", int, "items per batch, at most 100 (default 100)"),
    ("max-wait-ms", float, "longest wait of a queued item while a worker is free (default 50)"),
    ("idle-trigger", _bool, "flush at once while more than one worker is idle (default true)"),
    ("keys", Path, "TOML keys file: API keys -> tier and account"),
    ("admin-key", str, "key that may read /admin endpoints"),
    ("batch-latency-ms", float, "pad every batch to at least this (default 100 sim, 0 else)"),
    ("max-attempts", int, "runs of an item whose worker keeps dying (default 3)"),
    ("hang-timeout-ms", float, "kill a worker whose batch runs longer (default max(10x floor,5s))"),
    ("restart", _bool, "restart dead workers (default true)"),
    ("ready-timeout-s", float, "how long a worker may take to load (default 300)"),
    ("queue-capacity", int, "hard cap on queued items per tier (default 20000)"),
    ("max-request-timeout-ms", float, "cap on X-Request-Timeout-Ms (default 60000)"),
    ("max-body-bytes", int, "request body limit (default 1 MiB)"),
    ("max-input-chars", int, "characters per input string (default 10000)"),
    ("idempotency-ttl-s", float, "how long idempotent answers are kept (default 86400)"),
    ("idempotency-max-entries", int, "idempotency store bound (default 100000)"),
    ("gpus", int, "CUDA devices to use (default: all that torch sees; 0 on the CPU)"),
    ("log-level", str, "debug, info, warning or error (default info)"),
]


def build_parser(env: dict[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Fixed-batch dispatch for GPU inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser("serve", help="run the HTTP service")
    for name, kind, help in SERVE_FLAGS:
        _add(serve, name, kind, help, env)
    plan = sub.add_parser("plan", help="how many GPUs a load needs (simulated with our batcher)")
    from loadtest.plan import add_arguments

    add_arguments(plan)
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    names = {f.name for f in fields(Settings)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return Settings(**given)


def detect_gpus(model: str) -> int:
    """CUDA devices torch can see; 0 for `sim` or without CUDA.

    Asked of torch in a short-lived child: importing torch here would leave ~150,000
    long-lived objects in the server process, and every full collection of the garbage
    collector would walk them (a 135 ms pause measured) on the request path.
    """
    if model == "sim":
        return 0
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=120, check=True)
        return int(done.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        logging.getLogger("batchgate").warning("could not ask torch for CUDA devices; CPU only")
        return 0


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app

    settings = settings_from(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    gpus = args.gpus if args.gpus is not None else detect_gpus(settings.model)
    app = create_app(settings, gpus=gpus)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_level=settings.log_level,
        access_log=False, lifespan="on", timeout_graceful_shutdown=30, proxy_headers=False,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(dict(os.environ))
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "plan":
            from loadtest.plan import run_args

            return run_args(args, prog=f"{PROG} plan")
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
