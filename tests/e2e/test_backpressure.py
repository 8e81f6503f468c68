"""Clients that send requests and never read the answers, against the real server over raw
sockets (`loadtest.hostile_unread`): the server stops reading them, so its memory stays
bounded, and lets them go once their answers have waited the body timeout; other clients are
served meanwhile and after."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loadtest.hostile_unread import server_args, unread_scenario
from loadtest.server import running_server

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
BODY_TIMEOUT_S = 3.0
CONNECTIONS, REQUESTS = 3, 30  # 1 MB each: answered whole, ~90 MB would wait unread


def test_clients_that_read_nothing_hold_bounded_memory_and_are_cut_off() -> None:
    with running_server(workers=1, args=server_args(BODY_TIMEOUT_S, ROOT)) as srv:
        # Each request is sent after the one before it is answered (0.3 s apart), so none
        # waits behind another in uvicorn's queue: each is read after an answer is written.
        figures = unread_scenario(srv, CONNECTIONS, REQUESTS, 0.3, BODY_TIMEOUT_S)
        r = httpx.post(srv.url + "/v1/batchstring", json={"input": "abc"}, timeout=10)
    assert r.status_code == 200, r.text
    assert figures.growth_mib < 20, figures  # the server's HTTP processes, core included
    assert figures.answered < CONNECTIONS * REQUESTS / 2, figures  # the rest never read
    released = figures.released_after_s
    assert all(s is not None and s >= BODY_TIMEOUT_S for s in released), figures
