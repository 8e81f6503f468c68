"""The README's server, started as its reader starts it, and the reader's shell around it.

`scripts/serve` is `batchgate serve` with the example keys; the tests run that command from
the environment `scripts/serve` makes (a test holds the script to it) on a free port, in a
shell whose PATH starts with that environment, as after `source .venv/bin/activate`.
Readiness is another process's, so `/readyz` is polled, bounded.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.docs.pages import ROOT

BIN = Path(sys.executable).parent
DOCUMENTED = "127.0.0.1:8000"


def serve_flags() -> list[str]:
    """The flags `scripts/serve` gives `batchgate serve` before the caller's own (`$clone`:
    the clone's root, where it finds the example keys)."""
    match = re.search(r'^exec batchgate serve (.*) "\$@"$', (ROOT / "scripts/serve").read_text(),
                      re.M)
    assert match, "scripts/serve no longer execs `batchgate serve ... \"$@\"`"
    return [flag.replace("$clone", str(ROOT)) for flag in shlex.split(match[1])]


def shell_env() -> dict[str, str]:
    """This environment as an activated shell has it, without the server's variables (a
    test's own BATCHGATE_GATEWAYS, say) that would change what an example shows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHGATE_")}
    path = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "VIRTUAL_ENV": str(BIN.parent)}


@dataclass(frozen=True, slots=True)
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def address(self, text: str) -> str:
        """`text` with the documented address turned into this server's."""
        return text.replace(DOCUMENTED, f"127.0.0.1:{self.port}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused while starting, 503 until a worker is up
        return False


@contextmanager
def serving(flags: Sequence[str], ready_timeout_s: float) -> Iterator[Server]:
    """`batchgate serve` with scripts/serve's flags and `flags`, from the repository root."""
    port = _free_port()
    fd, name = tempfile.mkstemp(prefix="batchgate-docs-", suffix=".log")
    argv = [str(BIN / "batchgate"), "serve", *serve_flags(), *flags, "--port", str(port)]
    env = {**shell_env(), "BATCHGATE_DRAIN_DELAY_S": "0"}  # no load balancer to wait for
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(proc, port, Path(name))
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _ready(port):
            tail = "\n".join(server.log.read_text(errors="replace").splitlines()[-20:])
            assert proc.poll() is None, f"{shlex.join(argv)} exited {proc.returncode}:\n{tail}"
            assert time.monotonic() < deadline, f"{shlex.join(argv)} not ready:\n{tail}"
            time.sleep(0.1)
        yield server
    finally:
        _stop(proc)
        server.log.unlink(missing_ok=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def shell(script: str, cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`script` in bash, `-e` so that a failing line fails it, as a reader sees one fail."""
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=shell_env(), text=True,
                          capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
