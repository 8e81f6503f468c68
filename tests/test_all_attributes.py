"""Each package says what it offers: every name in `__all__` exists, and nothing is missing."""

import importlib
import subprocess
import sys

import pytest

from tests.imports import PACKAGES


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist_and_are_unique(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names {missing} that it does not define"


@pytest.mark.parametrize("name", ["batcher", "gpu_pool", "failover"])
def test_importing_a_core_package_loads_neither_torch_nor_a_server_nor_ray(name: str) -> None:
    code = (f"import sys, {name}; bad = [m for m in ('torch', 'uvicorn', 'starlette', 'ray') "
            "if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_ray_pool_module_says_what_it_offers() -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")
    test_all_names_exist_and_are_unique("gpu_pool.ray_pool")
