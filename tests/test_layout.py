"""The rooms of the whole product and the arrows between them: one package never reaches
into another's modules, whatever a package offers is in its `__all__`, and no module imports
itself in a circle (api/'s own rooms: tests/api/test_layout.py)."""

from __future__ import annotations

import importlib

from tests.imports import MODULES, PACKAGES, PRODUCT, graph, imports_of, package_of

# A room of api/ that is one module.
ROOM_MODULES = {"api.errors", "api.plan", "api.cli", "api.stopped"}
OPTIONAL = {"gpu_pool.ray_pool"}  # loads Ray: imported by name, only where Ray is wanted


def foreign_imports() -> list[tuple[str, str, tuple[str, ...]]]:
    """(importer, module, names) for each import of a module of another package."""
    out = []
    for module in MODULES:
        if module.split(".")[0] not in PRODUCT:
            continue
        for imp in imports_of(module):
            if imp.module not in MODULES or imp.module in ROOM_MODULES | OPTIONAL:
                continue
            if package_of(imp.module) != package_of(module):
                out.append((module, imp.module, imp.names))
    return out


def test_a_package_is_entered_only_through_its_init() -> None:
    reaching_in = sorted(f"{m} -> {t}" for m, t, _ in foreign_imports() if t not in PACKAGES)
    assert reaching_in == []


def test_every_name_another_package_takes_is_in_the_packages_all() -> None:
    missing = set()
    for module, target, names in foreign_imports():
        if target in PACKAGES:
            exported = set(importlib.import_module(target).__all__)
            missing |= {f"{target}.{n} (by {module})" for n in names
                        if n not in exported and f"{target}.{n}" not in MODULES}
    assert missing == set()


def test_no_module_imports_itself_in_a_circle() -> None:
    edges, state = graph(), dict[str, int]()  # 1: on the path, 2: done
    circles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                start = path.index(n) if n in path else len(path)
                circles.append(" -> ".join([*path[start:], m, n]))
            elif n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert circles == []
