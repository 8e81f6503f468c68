"""Start the real `batchgate serve` as a child process for load tests, and read it from outside.

Readiness here is an external process's, so polling `/readyz` (bounded) is the right tool.
The server runs in its own session: a Ctrl-C at the benchmark does not reach it or its
workers; `stop()` drains it with SIGTERM and says which of its processes outlived it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the module itself needs no HTTP client
    import httpx

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)")


class ServerError(RuntimeError):
    """The server did not become ready, or died; the message ends with its log's tail, and
    the whole log is kept at `log_path` (the caller removes it once read)."""

    def __init__(self, message: str, log_path: Path) -> None:
        super().__init__(f"{message}\n(server log kept: {log_path})")
        self.log_path = log_path


@dataclass(frozen=True, slots=True)
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


# No load balancer stands in front of a test or benchmark server: it stops at once on SIGTERM
# unless a test asks for the delay (by passing the variable itself).
NO_DRAIN_DELAY = {"BATCHGATE_DRAIN_DELAY_S": "0"}


def free_port() -> int:
    """A port free right now on 127.0.0.1 (the kernel's pick; a small race is acceptable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    workers: int = 1, model: str = "sim", args: Sequence[str] = (), ready_timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None, cwd: Path | None = None,
) -> RunningServer:
    """Spawn `batchgate serve` on a free port and return once `/readyz` answers 200; `env`
    is added to this process's environment, `cwd` (another checkout) is where it runs."""
    port = free_port()
    fd, name = tempfile.mkstemp(prefix=f"batchgate-{port}-", suffix=".log")
    cmd = [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", model, "--workers", str(workers), *args]
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **NO_DRAIN_DELAY, **(env or {})}, cwd=cwd)
    server = RunningServer(proc, port, Path(name))
    try:
        wait_ready(server, ready_timeout_s)
    except BaseException:
        stop_server(server)
        raise
    return server


def wait_ready(server: RunningServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerError(f"server exited with {server.process.returncode}:\n"
                              + server.log_tail(), server.log_path)
        if is_ready(server.url):
            return
        time.sleep(0.1)
    raise ServerError(f"server not ready after {timeout_s:.0f} s:\n" + server.log_tail(),
                      server.log_path)


def is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused while starting, or 503 (HTTPError) until the workers are up
        return False


def stop_server(server: RunningServer, grace_s: float = 20.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace_s`. Returns the pids of the server's children that
    were still alive after it exited (then killed): a clean drain returns []."""
    children = _children(server.pid)
    proc = server.process
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)
    return _kill_survivors(children)


@contextlib.contextmanager
def running_server(
    workers: int = 1, model: str = "sim", args: Sequence[str] = (), ready_timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None, cwd: Path | None = None,
) -> Iterator[RunningServer]:
    """`with running_server(2) as srv:` ... the server is stopped on every path; its log is
    kept (and its path printed) only when the body failed, so runs leave nothing behind."""
    server = start_server(workers, model, args, ready_timeout_s, env, cwd)
    try:
        yield server
    except BaseException:
        print(f"server log kept: {server.log_path}", file=sys.stderr)
        raise
    else:
        server.log_path.unlink(missing_ok=True)
    finally:
        leftovers = stop_server(server)
        if leftovers:
            print(f"warning: server {server.pid} left processes {leftovers}", file=sys.stderr)


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_survivors(pids: list[int], settle_s: float = 3.0) -> list[int]:
    """Give the children `settle_s` to follow their parent out (the multiprocessing
    resource tracker leaves a moment after it), then kill and name the ones still there."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=settle_s)
    killed: list[int] = []
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
                killed.append(p.pid)
    return killed


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of one process (or, with `children`, of its live children
    instead), as the kernel counts them."""
    import psutil

    proc = psutil.Process(pid)
    procs = proc.children(recursive=True) if children else [proc]
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def core_pid(server: RunningServer) -> int | None:
    """A cell's core process: its supervisor's child named `CORE_NAME` (None while the
    supervisor starts another, or in a single process)."""
    import psutil

    from api.cell import CORE_NAME

    for child in psutil.Process(server.pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == CORE_NAME:
                return int(child.pid)
    return None


def door_pid(server: RunningServer) -> int:
    """The process that runs the door: a cell's core process, or the single process."""
    return core_pid(server) or server.pid


def gateway_of(sock: socket.socket) -> int | None:
    """GET /healthz on a held connection: the gateway it reached (None: a 503)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return None if head.startswith(b"HTTP/1.1 503") else int(json.loads(body)["gateway"])


def code_of(r: httpx.Response) -> str:
    """An answer as the hostile scripts count it: "200", or its status and error code."""
    if r.status_code == 200:
        return "200"
    try:
        return f"{r.status_code} {r.json()['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return str(r.status_code)


def fetch_metrics(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """`/metrics` as {'name{labels}': value}; comments and unparsable lines are skipped."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        with contextlib.suppress(ValueError):
            samples[m.group(1)] = float(m.group(2))
    return samples


def metric(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`, in any order,
    as PromQL's `sum(name{labels})` (the request, queue and batch series carry `model` and
    `version` besides), e.g. reason="idle"; 0.0 if none."""
    want = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name and want <= set(filter(None, rest.rstrip("}").split(","))):
            total += value
    return total
