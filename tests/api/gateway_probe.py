"""Run as a main module, spawns a process the way a cell spawns a gateway (multiprocessing's
spawn, which imports the main module again in the child) and prints what the child loaded
once it has imported what a gateway imports."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
from multiprocessing.connection import Connection

import api.cli  # noqa: F401  # a cell's main module: the child imports it again


def loaded(settings: bytes, reply: Connection) -> None:
    import api.gateway  # noqa: F401  # the target's module, as `gateway_main` is found

    pickle.loads(settings)  # its arguments arrive pickled
    reply.send(sorted(sys.modules))


if __name__ == "__main__":
    from api.config import Settings

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=loaded, args=(pickle.dumps(Settings(model="sim")), send))
    child.start()
    print("\n".join(receive.recv()))
    child.join()
