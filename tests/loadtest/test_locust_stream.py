"""The locustfile's streaming user, at the unit level: its check (`check_stream`) passes a
right stream of either framing and names what is wrong with any other, and the user runs
only when named. The locustfile is read in a subprocess: importing locust monkey-patches
the process (gevent), which the test process must not be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.api.client_stream_fakes import ndjson, sse

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["ab", "cd", "ef"]
ANSWERS = [{"index": 2, "output": "fe"}, {"index": 0, "output": "ba"}, {"index": 1, "output": "dc"}]


def done(outputs: int = 3, errors: int = 0) -> dict[str, Any]:
    return {"done": True, "id": "a1", "model": "sim@v1",
            "counts": {"outputs": outputs, "errors": errors}}


CASES: dict[str, tuple[int, bytes, str]] = {  # name: (status, body, format)
    "right sse": (200, sse([*ANSWERS, done()]), "sse"),
    "right ndjson": (200, ndjson([*ANSWERS, done()]), "ndjson"),
    "wrong output": (200, sse([*ANSWERS[:2], {"index": 1, "output": "cd"}, done()]), "sse"),
    "missing index": (200, ndjson([*ANSWERS[:2], done(2)]), "ndjson"),
    "twice": (200, sse([*ANSWERS[:2], ANSWERS[0], done()]), "sse"),
    "no done": (200, ndjson(ANSWERS), "ndjson"),
    "after done": (200, ndjson([*ANSWERS, done(), ANSWERS[0]]), "ndjson"),
    "error": (200, sse([*ANSWERS[:2], {"index": 1, "error": {
        "code": "model_error", "message": "raised"}}, done(2, 1)]), "sse"),
    "counts": (200, sse([*ANSWERS, done(2, 1)]), "sse"),
    "ids": (200, sse(ANSWERS[:1]) + sse([*ANSWERS[1:], done()], 2), "sse"),
    "not json": (200, b"id: 0\ndata: {\n\n", "sse"),
    "refused": (503, b'{"error": {"code": "queue_full", "message": "no"}}', "sse"),
}
SCRIPT = """
import json, sys, types
from loadtest import locustfile as lf
cases = json.load(sys.stdin)
verdicts = {name: lf.check_stream(status, body.encode("latin-1"), TEXTS, fmt)
            for name, (status, body, fmt) in cases.items()}
def users(named):
    env = types.SimpleNamespace(parsed_options=types.SimpleNamespace(user_classes=named),
                                runner=None, user_classes=[lf.BatchstringUser, lf.StreamingUser])
    lf._only_named_streams(env)
    return [u.__name__ for u in env.user_classes]
print(json.dumps({"verdicts": verdicts, "plain": users([]), "named": users(["StreamingUser"])}))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    cases = {name: (status, body.decode("latin-1"), fmt)
             for name, (status, body, fmt) in CASES.items()}
    done = subprocess.run([sys.executable, "-c", SCRIPT.replace("TEXTS", repr(TEXTS))],
                          input=json.dumps(cases), capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(("case", "verdict"), [
    ("right sse", None),
    ("right ndjson", None),
    ("wrong output", "stream: a wrong output (not this input's)"),
    ("missing index", "stream: an input not answered"),
    ("twice", "stream: an input answered twice"),
    ("no done", "stream: no done event"),
    ("after done", "stream: an event after done"),
    ("error", "stream: an input's error model_error"),
    ("counts", "stream: done counts are not the stream's"),
    ("ids", "stream: event ids out of sequence"),
    ("not json", "stream: breaks the protocol"),
    ("refused", "HTTP 503 queue_full"),
])
def test_the_stream_check_names_what_is_wrong(seen: dict[str, Any], case: str,
                                              verdict: str | None) -> None:
    assert seen["verdicts"][case] == verdict


def test_the_streaming_user_runs_only_when_named(seen: dict[str, Any]) -> None:
    assert seen["plain"] == ["BatchstringUser"]
    assert seen["named"] == ["BatchstringUser", "StreamingUser"]
