"""Hostile: the disk under `--state sqlite:` fills up while the server runs.

    mount -t tmpfs -o size=1m tmpfs DIR   # a small disk of your own (root)
    python -m loadtest.hostile_full_disk --folder DIR [--root CHECKOUT] [--keys 5] [--tries 3]

Runs `batchgate serve --state sqlite:DIR/kept.db` (one worker, `tests.models:counting`,
which writes every input it runs to a file) from this checkout or `--root`, answers one
keyed request, then fills DIR with a file of zeros until the disk is full, and sends
`--keys` keyed requests `--tries` times each (a client retrying its 503s) and one request
without a key. Prints the statuses by code, how many times the model ran the keyed inputs,
and the plain request's status. It removes what it wrote in DIR; every wait is bounded.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx

from loadtest.server import running_server

PAID = {"Authorization": "Bearer paid-demo-key"}


def code_of(r: httpx.Response) -> str:
    try:
        return "ok" if r.status_code == 200 else str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "-"


def main(argv: Sequence[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--folder", type=Path, required=True,
                   help="an empty folder on a small file system of its own")
    a.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                   help="the checkout whose server runs (default: this one)")
    a.add_argument("--keys", type=int, default=5)
    a.add_argument("--tries", type=int, default=3)
    args = a.parse_args(argv)
    root, folder = args.root.resolve(), args.folder.resolve()
    counted = Path(tempfile.mkdtemp()) / "runs.txt"
    serve = ["--keys", str(root / "examples" / "keys.toml"),
             "--state", f"sqlite:{folder / 'kept.db'}"]
    codes: Counter[str] = Counter()
    try:
        with running_server(1, "tests.models:counting", serve, cwd=root,
                            env={"BATCHGATE_TEST_COUNT_FILE": str(counted)}) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as client:
            first = client.post("/v1/batchstring", json={"input": "before"},
                                headers={**PAID, "Idempotency-Key": "before"})
            subprocess.run(["dd", "if=/dev/zero", f"of={folder / 'filler'}", "bs=4k"],
                           capture_output=True, timeout=60, check=False)
            for n in range(args.keys):
                for _ in range(args.tries):
                    r = client.post("/v1/batchstring", json={"input": f"text-{n}"},
                                    headers={**PAID, "Idempotency-Key": f"k-{n}"})
                    codes[f"{r.status_code} {code_of(r)}"] += 1
            plain = client.post("/v1/batchstring", json={"input": "plain"}, headers=PAID)
    finally:
        for name in ("filler", "kept.db", "kept.db-wal", "kept.db-shm", "kept.db.lock"):
            (folder / name).unlink(missing_ok=True)
        runs = counted.read_text().splitlines() if counted.exists() else []
        shutil.rmtree(counted.parent, ignore_errors=True)
    print(f"root {root}; before the disk filled: {first.status_code}; "
          f"{args.keys} keys x {args.tries} tries on a full disk: {dict(codes)}; "
          f"model runs of those inputs: {sum(r.startswith('text-') for r in runs)}; "
          f"a request without a key: {plain.status_code}")


if __name__ == "__main__":
    main()
