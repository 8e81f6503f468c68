"""The front door's rooms and the arrows between them: what each room may import, no cycle
among api/'s modules, a gateway without the core; and the client (batchgate_client, a
distribution of its own in api/client/, no room of api) that imports and loads httpx alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
API = ROOT / "api"
CLIENT = API / "client" / "batchgate_client"
ALLOWED = {  # room -> the rooms of api/ it may import
    "errors": set(),
    "config": {"errors"},
    "metrics": {"errors", "kept"},
    "kept": set(),
    "http": {"config", "errors", "metrics"},
    "oip": {"http", "config", "errors"},
    "stream": {"http", "config", "errors", "metrics"},
    "door": {"http", "oip", "stream", "config", "errors", "metrics", "kept"},
    "gateway": {"http", "oip", "stream", "config", "errors", "metrics"},
    "cell": {"door", "gateway", "http", "oip", "config", "errors", "metrics", "kept"},
    "plan": {"config"},
    "stopped": set(),
    "cli": {"cell", "door", "http", "config", "errors", "plan", "stopped"},
    "__main__": {"cli", "stopped"},
}
CORE = ("failover", "gpu_pool", "torch")


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[str]:
    """Every module `path` imports, at any depth of its code."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def graph() -> dict[str, set[str]]:
    modules = {module_of(p): p for p in API.rglob("*.py") if not p.is_relative_to(CLIENT)}
    return {name: {m for m in imports(path) if m in modules} for name, path in modules.items()}


def room(module: str) -> str:
    return module.split(".")[1] if "." in module else "api"


def test_each_room_imports_only_the_rooms_below_it() -> None:
    wrong = {f"{m} -> {n}" for m, deps in graph().items() for n in deps
             if room(m) != room(n) and room(m) != "api"
             and room(n) not in ALLOWED[room(m)]}
    assert wrong == set()


def test_no_module_of_api_imports_itself_in_a_circle() -> None:
    edges, state = graph(), dict[str, int]()  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])


def test_no_module_of_api_is_over_400_lines() -> None:
    long = {p.name: n for p in API.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def loaded_by(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys; {code}; print(*sys.modules)"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return {m.split(".")[0] for m in out.stdout.split()}


def test_the_client_imports_httpx_anyio_and_the_standard_library_only() -> None:
    allowed = {"batchgate_client", "httpx", "anyio", *sys.stdlib_module_names}
    found = {m.split(".")[0] for p in CLIENT.glob("*.py") for m in imports(p)}
    assert "httpx" in found
    assert found - allowed == set()


def test_the_client_loads_httpx_and_the_standard_library_only() -> None:
    heavy = {"uvicorn", "starlette", "prometheus_client", "torch", "batcher", "failover",
             "gpu_pool", "orjson", "uvloop", "api"}
    loaded = loaded_by("import batchgate_client")
    assert "batchgate_client" in loaded
    assert loaded & heavy == set()


@pytest.mark.parametrize("room_name", ["http", "gateway", "config", "errors", "metrics"])
def test_a_room_a_gateway_loads_loads_none_of_the_core(room_name: str) -> None:
    assert loaded_by(f"import api.{room_name}") & set(CORE) == set()


def test_a_spawned_gateway_process_has_none_of_the_core_loaded() -> None:
    out = subprocess.run([sys.executable, "-m", "tests.api.gateway_probe"], capture_output=True,
                         text=True, check=True, cwd=ROOT, timeout=120)
    loaded = set(out.stdout.split())
    assert {"api.gateway", "api.cli", "__mp_main__"} <= loaded  # the main module came again
    assert {m for m in loaded if m.split(".")[0] in CORE} == set()
