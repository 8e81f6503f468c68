"""The client is a distribution of its own: `pip install ./api/client` into an empty virtual
environment brings batchgate_client, httpx and what httpx needs, and nothing of the server:
neither its dependencies nor its top-level packages (an `api` would clash with a user's own).
pip fetches httpx as it would for a user (the package index, or pip's own configuration's
wheels). The server's wheel shipping no client is held in tests/test_packaging.py, which
builds that wheel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CLIENT = Path(__file__).parents[2] / "api" / "client"
SERVER = ("api", "batcher", "failover", "gpu_pool", "loadtest",  # its top-level packages
          "uvicorn", "starlette", "httptools", "uvloop", "orjson", "prometheus_client",
          "click", "torch")
ALLOWED = {  # batchgate-client, httpx, httpx's own dependencies, and what venv puts in
    "batchgate-client", "httpx", "anyio", "certifi", "httpcore", "h11", "idna", "sniffio",
    "typing-extensions", "pip", "setuptools"}
PROBE = f"""
import importlib.metadata, importlib.util, json
import batchgate_client
print(json.dumps({{
    "client": [n for n in ("Client", "AsyncClient") if hasattr(batchgate_client, n)],
    "found": [m for m in {SERVER!r} if importlib.util.find_spec(m) is not None],
    "installed": [d.metadata["Name"] for d in importlib.metadata.distributions()],
}}))
"""


def run(*args: str | Path, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_installing_the_client_brings_httpx_and_nothing_of_the_server(tmp_path: Path) -> None:
    source = tmp_path / "client"  # a copy: pip builds in the tree it is given
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "build"))
    run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", source, cwd=tmp_path)
    seen = json.loads(run(python, "-I", "-c", PROBE, cwd=tmp_path))  # -I: no PYTHONPATH, no cwd
    assert seen["client"] == ["Client", "AsyncClient"]
    assert seen["found"] == []
    installed = {re.sub(r"[-_.]+", "-", name).lower() for name in seen["installed"]}
    assert {"batchgate-client", "httpx"} <= installed
    assert installed - ALLOWED == set()
