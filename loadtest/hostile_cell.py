"""Hostile to a cell's supervisor (`--gateways 2`): broken files on disk when the core dies,
a stopped supervisor, and how held connections spread over the gateways.

    python -m loadtest.hostile_cell [--root DIR] [--runs 2] [--connections 20]

Runs `batchgate serve` (one `sim` worker) from this checkout or `--root` (a checkout of
the code before, to compare), three times over:

- broken files: the models and keys files are broken on disk, SIGHUP (refused: serving
  goes on), then the core is SIGKILLed; the files are fixed `--fix-at` seconds after the
  kill and SIGHUP sent again. Prints the seconds /readyz answered 503 after the kill and
  whether a request was answered 200 within `--fix-at`.
- stopped supervisor: SIGSTOP to the supervisor for `--stop-s` seconds; prints the seconds
  until /readyz (new connections, either gateway) first said 503, and until it said 200
  again after SIGCONT (None: never within the stop, or within 10 s after it).
- spread: `--connections` connections opened at once and held, then each asked GET
  /healthz: how many each gateway holds (`--runs` times, a fresh cell each).

Every wait is bounded; a run takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from loadtest.server import core_pid, gateway_of, is_ready, running_server

MODELS = '[models.a]\n[models.a.versions.v1]\nspec = "sim"\n'
KEYS = Path(__file__).parents[1] / "examples" / "keys.toml"


def broken_files(root: Path, fix_at: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        models, keys = Path(folder) / "models.toml", Path(folder) / "keys.toml"
        models.write_text(MODELS)
        keys.write_text(KEYS.read_text())
        keys.chmod(0o600)
        args = ["--gateways", "2", "--models", str(models), "--keys", str(keys)]
        with running_server(workers=1, args=args, cwd=root) as srv:
            models.write_text("[models.a\n")
            keys.write_text("[[keys]]\nkey = 'k'\ntier = 'gold'\n")
            os.kill(srv.pid, signal.SIGHUP)
            time.sleep(0.5)  # a benchmark: the SIGHUP's reading is done well within this
            dead = core_pid(srv)
            assert dead is not None
            killed = time.monotonic()
            os.kill(dead, signal.SIGKILL)
            time.sleep(0.2)  # the gateways see the link close
            fixed, ready_at = False, None
            while time.monotonic() - killed < fix_at + 30:
                if not fixed and time.monotonic() - killed >= fix_at:
                    models.write_text(MODELS)
                    keys.write_text(KEYS.read_text())
                    os.kill(srv.pid, signal.SIGHUP)
                    fixed = True
                if is_ready(srv.url):
                    ready_at = time.monotonic() - killed
                    break
                time.sleep(0.05)
    return {"fix_at_s": fix_at, "not_ready_s": None if ready_at is None else round(ready_at, 2),
            "served_before_the_fix": ready_at is not None and ready_at < fix_at}


def ready_within(url: str, ready: bool, within: float) -> float | None:
    """Seconds until 4 /readyz answers in a row say `ready` (None: not within)."""
    start, seen = time.monotonic(), 0
    while time.monotonic() - start < within:
        seen = seen + 1 if is_ready(url) == ready else 0
        if seen == 4:
            return round(time.monotonic() - start, 2)
        time.sleep(0.05)
    return None


def stopped_supervisor(root: Path, stop_s: float) -> dict[str, object]:
    with running_server(workers=1, args=["--gateways", "2"], cwd=root) as srv:
        stopped = time.monotonic()
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            not_ready = ready_within(srv.url, False, stop_s)
            time.sleep(max(0.0, stop_s - (time.monotonic() - stopped)))
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        ready_again = ready_within(srv.url, True, 10.0)
    return {"stop_s": stop_s, "readyz_503_after_s": not_ready, "readyz_200_again_after_s":
            ready_again}


def spread(root: Path, connections: int) -> dict[str, int]:
    args = ["--gateways", "2", "--max-connections", str(connections)]
    held: Counter[str] = Counter()
    with running_server(workers=1, args=args, cwd=root) as srv:
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                 for _ in range(connections)]
        try:
            for sock in socks:
                slot = gateway_of(sock)
                held["refused" if slot is None else f"gateway {slot}"] += 1
        finally:
            for sock in socks:
                sock.close()
    return dict(sorted(held.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                        help="the checkout to run the server from (default this one)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--fix-at", type=float, default=25.0)
    parser.add_argument("--stop-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    print("broken files:", json.dumps(broken_files(root, args.fix_at)), flush=True)
    print("stopped supervisor:", json.dumps(stopped_supervisor(root, args.stop_s)), flush=True)
    for _ in range(args.runs):
        print("spread:", json.dumps(spread(root, args.connections)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["broken_files", "main", "spread", "stopped_supervisor"]
