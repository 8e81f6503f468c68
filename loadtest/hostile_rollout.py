"""Hostile to the fleet: a rollout to a version that cannot load (issue 40, item 1).

    python -m loadtest.hostile_rollout [--root DIR] [--seconds 40]

Runs `batchgate serve --workers 2` from this checkout or `--root` (a checkout of the code
before, to compare) with a catalogue whose model `m` has a working `v1` (the default) and a
`v2` whose import kills its worker (`tests.models_broken:never`). Once both workers hold v1,
`PUT /admin/models/m {"default": "v2"}`, then for `--seconds`: 2 paid requests/s to `m`, and
one to `m@v2` every 2 s (each with a 5 s deadline). Prints the answers by status and code
for each, the slowest answer to `m@v2`, the workers' restarts, what holds m's workers at the
end, the serving default and /readyz. Every request is bounded by its deadline; a run takes
`--seconds` plus the workers' first residency (10 s) and start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx

from loadtest.server import code_of, running_server

PAID = {"Authorization": "Bearer paid-demo-key", "X-Request-Timeout-Ms": "5000"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}
CATALOGUE = """
[models.m]
default = "v1"
[models.m.versions.v1]
spec = "tests.models_versions:v1"
load_s = 1
[models.m.versions.v2]
spec = "tests.models_broken:never"
load_s = 1
"""


def run(root: Path, seconds: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "models.toml"
        path.write_text(CATALOGUE)
        args = ["--keys", str(root / "examples" / "keys.toml"), "--models", str(path)]
        with running_server(workers=2, args=args, cwd=root) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as client:
            r = client.put("/admin/models/m", json={"default": "v2"}, headers=ADMIN)
            put = code_of(r)
            to_m: Counter[str] = Counter()
            to_v2: Counter[str] = Counter()
            slowest_v2 = 0.0
            began = time.monotonic()
            n = 0
            while (now := time.monotonic() - began) < seconds:
                body: dict[str, str] = {"input": f"x{n}", "model": "m"}
                if n % 4 == 3:
                    body["model"] = "m@v2"
                t0 = time.monotonic()
                answer = client.post("/v1/batchstring", json=body, headers=PAID)
                took = time.monotonic() - t0
                if body["model"] == "m@v2":
                    to_v2[code_of(answer)] += 1
                    slowest_v2 = max(slowest_v2, took)
                else:
                    to_m[code_of(answer)] += 1
                n += 1
                time.sleep(max(0.0, (n * 0.5) - (time.monotonic() - began)))  # 2/s paced
            workers = client.get("/admin/workers", headers=ADMIN).json()["workers"]
            view = client.get("/admin/models", headers=ADMIN).json()
            (m,) = [x for x in view["models"] if x["name"] == "m"]
            return {
                "root": str(root), "seconds": round(now, 1), "put": put,
                "to_m": dict(to_m), "to_m_v2": dict(to_v2),
                "slowest_m_v2_s": round(slowest_v2, 2),
                "restarts": sum(w["restarts"] for w in workers),
                "workers": Counter(f"{w['version']} {w['state']}" for w in workers),
                "serving_default": m["serving_default"],
                "v2_state": next(v["state"] for v in m["versions"] if v["version"] == "v2"),
                "readyz": client.get("/readyz").status_code,
            }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parents[1])
    parser.add_argument("--seconds", type=float, default=40.0)
    a = parser.parse_args(argv)
    print(json.dumps(run(a.root.resolve(), a.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
