"""The product's modules and what each imports, read from the source (lazy imports and
`TYPE_CHECKING` blocks included): what the layout tests hold to account."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
TOPS = ("api", "batcher", "batchgate_client", "failover", "gpu_pool", "loadtest")
PRODUCT = ("api", "batcher", "batchgate_client", "failover", "gpu_pool")  # loadtest reads internals
CLIENT = ROOT / "api" / "client"  # batchgate_client's own distribution, not a room of api


def _modules() -> dict[str, Path]:
    out = {}
    for top in TOPS:
        base = CLIENT if top == "batchgate_client" else ROOT
        for path in (base / top).rglob("*.py"):
            if top == "api" and path.is_relative_to(CLIENT):
                continue
            parts = path.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()
PACKAGES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py" and m != "loadtest")


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    module: str  # the product module named
    names: tuple[str, ...]  # what `from module import ...` takes (empty: `import module`)


def imports_of(module: str) -> list[Import]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            out.append(Import(module, base, tuple(a.name for a in node.names)))
    return [i for i in out if i.module.split(".")[0] in TOPS]


def package_of(module: str) -> str:
    return module if module in PACKAGES else module.rpartition(".")[0]


def graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (a package's `__init__` counts as the
    package; `from package import submodule` as the submodule)."""
    edges: dict[str, set[str]] = {}
    for module in MODULES:
        out = set()
        for imp in imports_of(module):
            for target in [imp.module, *(f"{imp.module}.{n}" for n in imp.names)]:
                while target and target not in MODULES:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    out.add(target)
        edges[module] = out
    return edges
