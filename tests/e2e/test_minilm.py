"""The real model behind real HTTP: obviously topical sentences get the right labels."""

from __future__ import annotations

import httpx
import pytest

from api.client import Client
from loadtest.server import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CASES = {
    "The striker scored twice in the cup final": "sports",
    "Shares of the bank fell after its quarterly earnings report": "business",
    "The new smartphone ships with a faster processor and more memory": "technology",
    "Heavy rain and thunderstorms are forecast for the weekend": "weather",
    "Parliament passed the bill after a long debate between the parties": "politics",
}


def test_topical_sentences_get_their_labels_over_http() -> None:
    with running_server(workers=1, model="minilm", ready_timeout_s=240) as srv:
        with Client(srv.url, timeout=120) as client:
            assert client.batchstring(list(CASES)) == list(CASES.values())
        one = httpx.post(srv.url + "/v1/batchstring", json={"input": "The striker scored twice"
                                                                     " in the cup final"},
                         timeout=120)
        assert one.json()["output"] == "sports"
