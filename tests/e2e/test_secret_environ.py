"""A secret given in the environment (`BATCHGATE_ADMIN_KEY`) is in no process's
/proc/<pid>/environ once the server runs, its own included, and still works. Run against a
single process and a cell (the module's `gateways` fixture)."""

from __future__ import annotations

import httpx
import pytest

from loadtest.server import running_server

pytestmark = pytest.mark.e2e
SECRET = "s3cret-admin-key-in-the-environment"


def test_the_admin_key_from_the_environment_is_in_no_process_environ_and_works() -> None:
    with running_server(workers=1, env={"BATCHGATE_ADMIN_KEY": SECRET}) as srv:
        admin = {"Authorization": f"Bearer {SECRET}"}
        listing = httpx.get(srv.url + "/admin/workers", headers=admin, timeout=10)
        assert listing.status_code == 200
        workers = [w["pid"] for w in listing.json()["workers"]]
        gateways = [g["pid"] for g in listing.json()["gateways"]]
        for pid in [srv.pid, *workers, *gateways]:
            # What anyone who may read /proc/<pid>/environ sees: the block the process was
            # started with, whatever it removed from os.environ since.
            with open(f"/proc/{pid}/environ", "rb") as environ:
                assert SECRET.encode() not in environ.read(), pid
        assert httpx.get(srv.url + "/admin/workers", timeout=10).status_code == 401
