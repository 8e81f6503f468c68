"""The locustfile, run headless by the real `locust` command against the real sim server:
every answer checked, the shape ends by itself, and the gate sets the exit code."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadtest.server import running_server

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with running_server(workers=2, args=["--keys", str(ROOT / "examples" / "keys.toml")]) as srv:
        yield srv.url


def run_locust(url: str, tmp_path: Path, *args: str, timeout: float = 30.0) -> tuple[
    subprocess.CompletedProcess[str], dict[str, str]
]:
    """Run the locustfile headless; return the process and the CSV's Aggregated row
    (failure messages land in `tmp_path / "run_failures.csv"`)."""
    prefix = tmp_path / "run"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "--host", url, "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING",
           *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    stats = Path(f"{prefix}_stats.csv")
    assert stats.exists(), proc.stdout + proc.stderr
    with stats.open(newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    return proc, rows["Aggregated"]


def verdict(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("verdict: ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


def test_the_100_rps_shape_scaled_makes_checked_requests_and_passes(
    server_url: str, tmp_path: Path
) -> None:
    proc, total = run_locust(server_url, tmp_path, "--shape", "steady100", "--scale", "0.5",
                             "--duration", "8")
    line = verdict(proc)
    assert proc.returncode == 0, line + "\n" + proc.stderr[-3000:]
    assert line.startswith("verdict: PASS shape=steady100 scale=0.5"), line
    requests, failures = int(total["Request Count"]), int(total["Failure Count"])
    assert failures == 0, proc.stdout
    assert 0.75 * 50 * 8 <= requests <= 1.1 * 50 * 8, line  # 50 RPS held for 8 s
    assert float(total["95%"]) >= 100  # no answer can come before the 100 ms batch


def test_an_impossible_p95_threshold_fails_the_run(server_url: str, tmp_path: Path) -> None:
    proc, total = run_locust(server_url, tmp_path, "--shape", "steady100", "--scale", "0.2",
                             "--duration", "2", "--p95-ms", "1")
    line = verdict(proc)
    assert proc.returncode == 1, line
    assert line.startswith("verdict: FAIL") and "p95" in line, line
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == 0


class Unreversed(BaseHTTPRequestHandler):
    """A broken gateway: 200 with a well-formed answer whose output is the input as sent."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
        body = json.dumps({"id": "x", "output": text}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_wrong_output_is_a_failure_not_a_success(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unreversed)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        proc, total = run_locust(url, tmp_path, "--scale", "0.2", "--duration", "2")
    finally:
        server.shutdown()
        server.server_close()
    line = verdict(proc)
    assert proc.returncode == 1, line
    assert int(total["Request Count"]) == int(total["Failure Count"]) > 0, line
    assert "wrong output" in (tmp_path / "run_failures.csv").read_text()
