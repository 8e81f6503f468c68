"""`batchgate serve` and `batchgate plan`. The serve flags come from the settings
(`api.config`), each also read from `BATCHGATE_<NAME>`.

A bad value is one line on stderr and exit status 2, never a traceback; so is a port that
another process holds, found before any model loads. A signal at any moment of the start
stops it at once with one line (status 128 + the signal's number).

Each command loads its room when it runs, not when this module is imported: a cell's
gateways are spawned processes, and multiprocessing's spawn imports the main module (this
one) again in each of them, where the dispatch core must not be loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from api.config import (
    Parser,
    Settings,
    add_settings_flags,
    check_files,
    describe,
    forget_secrets,
    hash_key,
    knobs,
    load_keys,
    settings_from,
)
from api.stopped import PROG, say_stopped, stop_now

if TYPE_CHECKING:
    from gpu_pool import CellIdentity


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Fixed-batch dispatch for GPU inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    serve = sub.add_parser("serve", help="run the HTTP service")
    add_settings_flags(serve, env)
    serve.add_argument("--print-config", action="store_true",
                       help="print the effective configuration (secrets masked) and exit")
    from api.plan import add_arguments as add_plan_arguments

    plan = sub.add_parser("plan", help="how many GPUs a load needs (simulated with our batcher)")
    add_plan_arguments(plan)
    keys = sub.add_parser("keys", help="keys file helpers")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, parser_class=Parser)
    keys_sub.add_parser("hash", help="read a key on stdin (not argv: ps shows argv), print "
                                     "the sha256:<hex> a keys file may hold instead of it")
    return parser


def detect_gpus(specs: list[str]) -> int:
    """CUDA devices torch can see; 0 when no model of `specs` uses one, or without CUDA.

    Asked of torch in a short-lived child: importing torch here would leave a great many
    long-lived objects in the server process, and every full collection of the garbage
    collector would walk them on the request path.
    """
    from gpu_pool import uses_gpu

    if not any(uses_gpu(spec) for spec in specs):
        return 0
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=120, check=True)
        return int(done.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        logging.getLogger("batchgate").warning("could not ask torch for CUDA devices; CPU only")
        return 0


DEMO_KEYS = frozenset({"paid-demo-key", "free-demo-key", "admin-demo-key"})
DEMO_ENTRIES = DEMO_KEYS | {hash_key(k) for k in DEMO_KEYS}  # held plain or hashed
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def refuse_public_demo_keys(settings: Settings) -> None:
    """The demo keys are printed in README.md: a server holding them, plain or hashed, in its
    keys file or as its admin key, answers only on loopback."""
    if settings.host in LOOPBACK:
        return
    if settings.admin_key in DEMO_ENTRIES:
        raise ValueError("BATCHGATE_ADMIN_KEY is the public demo admin key: serve on "
                         "127.0.0.1 only, or choose an admin key of your own")
    if settings.keys is None:
        return
    ring = load_keys(settings.keys)
    if DEMO_ENTRIES & (ring.keys.keys() | ring.admin_keys):
        raise ValueError(f"{settings.keys} holds the public demo keys: serve it on 127.0.0.1 "
                         "only, or give --keys a file of your own")


def warn_open_keys_file(settings: Settings) -> None:
    """A keys file that group or others may read or write gives its keys away: say so at
    start-up, naming the file and its mode, as ssh does of a private key. Not of a file
    that holds the public demo keys alone on loopback (README prints them, and its own
    command serves them so): it has nothing to give away."""
    if settings.keys is None:
        return
    try:
        mode = stat.S_IMODE(settings.keys.stat().st_mode)
    except OSError:
        return  # loading it says why
    demo = settings.host in LOOPBACK and demo_keys_only(settings.keys)
    if mode & 0o077 and not demo:
        logging.getLogger("batchgate").warning(
            "keys file %s has mode %04o: open to group or others; chmod 600 it",
            settings.keys, mode)


def demo_keys_only(path: Path) -> bool:
    """Whether the keys file at `path` holds keys, and only the public demo keys."""
    try:
        ring = load_keys(path)
    except ValueError:
        return False  # loading it again says why
    held = ring.keys.keys() | ring.admin_keys
    return bool(held) and held <= DEMO_ENTRIES


def check_port(host: str, port: int, flag: str = "--port") -> None:
    """The port can be listened on, asked before any model loads (uvicorn binds once its
    lifespan has started, which waits for the workers; a cell's gateways bind --grpc-port
    each, and would be restarted without end on a port held). ValueError naming what to
    do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; stop "
                             f"what holds it (ss -ltnp 'sport = :{port}'), or pass another "
                             f"{flag}") from None


def interrupted(sig: int) -> int:
    """One line for a server stopped by a signal before it served, or by a second one (no
    traceback); the exit status a shell gives it. The process is leaving: one more of the
    signal is ignored from here on, so it ends with that status, not by the signal (the
    start-up's Ctrl-C test saw about one run in fifteen end by SIGINT after this line)."""
    signal.signal(sig, signal.SIG_IGN)
    say_stopped(sig)
    return 128 + sig


def with_ray(settings: Settings, env: Mapping[str, str]) -> Settings:
    """`--pool ray`: Ray must be installed (one line if not), and the cluster's address
    defaults to Ray's own RAY_ADDRESS."""
    if settings.pool != "ray":
        return settings
    if importlib.util.find_spec("ray") is None:
        raise ValueError("--pool ray needs Ray, which is not installed here: "
                         "pip install 'batchgate[ray]'")
    if settings.ray_address is None and env.get("RAY_ADDRESS"):
        return dataclasses.replace(settings, ray_address=env["RAY_ADDRESS"])
    return settings


def check_model_extra(settings: Settings) -> None:
    """A built-in model whose packages are an extra (a client never needs torch): one line
    if they are missing here, not a worker's traceback (Ray actors load it on their own
    nodes)."""
    from gpu_pool import missing_extra

    if settings.pool != "process":
        return
    for spec in model_specs(settings):
        extra = missing_extra(spec)
        if extra is not None:
            raise ValueError(f"model {spec} needs what is not installed here: "
                             f"pip install 'batchgate[{extra}]'")


def model_specs(settings: Settings) -> list[str]:
    """Every spec the server may load: `--model`'s, or each version's of `--models`."""
    from api.door import catalogue_of

    catalogue = catalogue_of(settings)
    return [catalogue.config_of(v)[1].spec for v in catalogue.versions()]


SECRETS_FD = "BATCHGATE_SECRETS_FD"  # the pipe a re-executed server reads its secrets from
MAX_SECRETS_BYTES = 4096  # a pipe holds at least a page before its writer waits


def exec_without_secrets() -> None:
    """Start this command again, its secret variables handed over a pipe: they are out of
    this process's /proc/<pid>/environ, the block it was started with, which removing them
    from `os.environ` leaves as it was. The same pid, so a supervisor sees no change. Returns
    only if no secret variable is set."""
    secrets = {k.env: os.environ[k.env] for k in knobs() if k.secret and k.env in os.environ}
    if not secrets or not sys.executable:
        return
    data = json.dumps(secrets).encode()
    if len(data) > MAX_SECRETS_BYTES:
        raise ValueError(f"the secret variables hold over {MAX_SECRETS_BYTES} bytes")
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    os.set_inheritable(read, True)
    env = {k: v for k, v in os.environ.items() if k not in secrets} | {SECRETS_FD: str(read)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def handed_secrets(environ: MutableMapping[str, str]) -> dict[str, str]:
    """The secret variables `exec_without_secrets` handed over, read once from their pipe."""
    fd = environ.pop(SECRETS_FD, None)
    if fd is None:
        return {}
    try:
        with os.fdopen(int(fd), "rb") as pipe:
            secrets = json.loads(pipe.read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{SECRETS_FD}={fd} is no pipe of secrets ({exc})") from None
    return {k.env: str(secrets[k.env]) for k in knobs() if k.secret and k.env in secrets}


def with_gpus(settings: Settings) -> Settings:
    """`--gpus` as given, else the CUDA devices torch sees on this host (a Ray pool's
    actors find their GPUs on their own nodes: 0 here)."""
    if settings.gpus is not None:
        return settings
    local = settings.pool == "process"
    gpus = detect_gpus(model_specs(settings)) if local else 0
    return dataclasses.replace(settings, gpus=gpus)


def cell_identity(env: Mapping[str, str]) -> CellIdentity | None:
    """The cell `BATCHGATE_CELL_ID` names (None: a cell of this server's own), read here
    alone: the cores learn theirs as an argument."""
    from gpu_pool import CellIdentity

    return CellIdentity.from_env(env)


def serve(args: argparse.Namespace) -> int:
    from api.door import build, check_core_settings, check_state
    from api.http import DrainingServer, server_config

    settings = settings_from(args)
    check_files(settings)
    check_port(settings.host, settings.port)
    if settings.grpc_port is not None:
        check_port(settings.host, settings.grpc_port, "--grpc-port")
    check_core_settings(settings)
    check_state(settings)
    identity = cell_identity(os.environ)
    forget_secrets(os.environ)  # read: the processes spawned from here need not see them
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    warn_open_keys_file(settings)
    refuse_public_demo_keys(settings)
    settings = with_ray(settings, os.environ)
    check_model_extra(settings)
    settings = with_gpus(settings)
    if settings.gateways > 1:
        from api.cell import serve_cell

        code = serve_cell(settings, None if identity is None else identity.cell)
        return interrupted(code - 128) if code > 128 else code
    built = build(settings, identity=identity)
    config = server_config(built.app, settings, built.direct)
    server = DrainingServer(config, settings.drain_delay_s, built.service.leave)
    server.run()
    return 0 if server.interrupted is None else interrupted(server.interrupted)


def main(argv: Sequence[str] | None = None) -> int:
    before = signal.signal(signal.SIGINT, stop_now)  # until a server takes Ctrl-C over
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the server handles signals, or a second one after
        return interrupted(signal.SIGINT)
    finally:
        if signal.getsignal(signal.SIGINT) is stop_now:  # a caller's own (a test's)
            signal.signal(signal.SIGINT, before)


def _main(argv: Sequence[str] | None) -> int:
    try:
        handed = handed_secrets(os.environ)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ) | handed
    parser = build_parser(env)
    args = parser.parse_args(argv)
    try:
        if args.command == "serve" and args.print_config:
            settings = settings_from(args)
            check_files(settings)
            print(describe(settings, sys.argv[1:] if argv is None else argv, env))
            return 0
        if args.command == "serve":
            if argv is None:  # this process's own command line: it can be run again
                exec_without_secrets()
            return serve(args)
        if args.command == "keys":
            key = sys.stdin.readline().strip()
            if not key:
                raise ValueError("no key on stdin")
            print(hash_key(key))
            return 0
        if args.command == "plan":
            from api.plan import run_args

            return run_args(args, prog=f"{PROG} plan")
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
