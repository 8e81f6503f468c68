"""`api.kept` says what it offers, and importing it loads no Redis client (an extra:
only `--state redis://` needs it)."""

import subprocess
import sys

import api.kept


def test_every_name_offered_exists_once() -> None:
    exported = api.kept.__all__
    assert len(exported) == len(set(exported))
    assert [n for n in exported if not hasattr(api.kept, n)] == []


def test_importing_the_state_package_loads_no_redis_client() -> None:
    code = "import sys, api.kept; print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
