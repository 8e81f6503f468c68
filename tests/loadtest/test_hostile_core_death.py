"""`loadtest.hostile_core_death`'s wait for a restarted core's workers, against a stand-in
admin endpoint: a cell's gateway not yet linked to the new core answers 503 while another
already answers /readyz."""

from __future__ import annotations

import json
import threading
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loadtest import hostile_core_death
from loadtest.hostile_core_death import worker_pids

Answer = tuple[int, dict[str, Any]]
UP: dict[str, Any] = {"workers": [{"pid": 12, "state": "ready"}, {"pid": 11, "state": "busy"}]}


@contextmanager
def admin(answers: list[Answer]) -> Iterator[str]:
    """/admin/workers answering each of `answers` in turn, the last one from then on."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name for it
            status, body = answers.pop(0) if len(answers) > 1 else answers[0]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_gateway_still_reconnecting_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostile_core_death, "POLL_S", 0.0)
    down: Answer = (503, {"error": {"code": "core_unavailable"}})
    with admin([down, down, (200, UP)]) as url:
        assert worker_pids(url, 2) == [11, 12]


def test_another_error_is_not_taken_for_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostile_core_death, "POLL_S", 0.0)
    with admin([(401, {"error": {"code": "unauthorized"}})]) as url, \
            pytest.raises(urllib.error.HTTPError):
        worker_pids(url, 2)
