"""A signal while the server starts (`DrainingServer`), in a process of its own: the start's
lifespan is unwound while uvicorn's serve still waits for it, never left to asyncio's close,
which cancels every task at once (anyio then waited for good on a child cancelled before
its first step: the start-up's Ctrl-C test hung, about once in a hundred starts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[3]

CTRL_C_AS_THE_LIFESPAN_IS_MADE = """
import signal
from contextlib import asynccontextmanager

import anyio
import uvicorn
from starlette.applications import Starlette

from api.http import DrainingServer
from loadtest.server import free_port

unwound = []


@asynccontextmanager
async def lifespan(app):
    try:
        await anyio.sleep_forever()  # the service starting
    except anyio.get_cancelled_exc_class():
        unwound.append("while the serve waits" if not server._serving.done()
                       else "by asyncio's close")
        raise
    yield


class Pressed(DrainingServer):
    async def startup(self, sockets=None):
        # Ctrl-C in the serve's step that makes the lifespan's task, before that task runs
        self.handle_exit(signal.SIGINT, None)
        await super().startup(sockets)


config = uvicorn.Config(Starlette(lifespan=lifespan), host="127.0.0.1", port=free_port(),
                        lifespan="on", log_level="critical")
server = Pressed(config, 0.0, lambda: None)
server.run()
print(server.interrupted, unwound, flush=True)
"""


def test_ctrl_c_before_the_lifespans_task_runs_unwinds_it_while_the_serve_waits() -> None:
    done = subprocess.run([sys.executable, "-c", CTRL_C_AS_THE_LIFESPAN_IS_MADE], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "2 ['while the serve waits']", done.stdout
