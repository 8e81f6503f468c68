"""Run a command where loopback is the only network interface.

Left to itself Ray registers its services on the host's interface address (and turns
127.0.0.1 in an address into it), while test and benchmark traffic here may go to loopback
only. So every Ray test and benchmark runs in a network namespace of its own, made with
`unshare --net` (root, or user namespaces), where `lo`, brought up, is all there is. The
namespace ends with the last process in it.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Sequence

_UP_THEN_EXEC = 'ip link set lo up && exec "$@"'


def loopback_only() -> bool:
    """True inside such a namespace: this process sees no interface but `lo`."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def netns_argv(argv: Sequence[str]) -> list[str]:
    """`argv` run in a fresh network namespace with only `lo`, up. unshare, sh and the
    command replace one another (exec), so the returned command's pid is the command's."""
    return ["unshare", "--net", "--", "sh", "-c", _UP_THEN_EXEC, "netns", *argv]


def netns_unavailable() -> str | None:
    """Why no namespace can be made here (not root, no `ip`), or None when one can."""
    try:
        done = subprocess.run(netns_argv(["true"]), capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run unshare: {exc}"
    if done.returncode != 0:
        return f"cannot make a network namespace: {done.stderr.strip()[:200]}"
    return None


def rerun_isolated(module: str, argv: Sequence[str]) -> int:
    """Run `python -m module argv` in such a namespace and return its exit status. A Ray
    token in the environment spares Ray writing one to ~/.ray/auth_token."""
    env = {**os.environ, "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN")
           or secrets.token_hex(16)}
    return subprocess.call(netns_argv([sys.executable, "-m", module, *argv]), env=env)


__all__ = ["loopback_only", "netns_argv", "netns_unavailable", "rerun_isolated"]
