"""What crosses the link between a gateway and the core survives the trip whole."""

from __future__ import annotations

import pickle

from api.gateway import outcome_message, outcome_of
from api.http import Answered, Rendered


def test_a_keyed_run_crosses_the_link_with_its_version_and_waits() -> None:
    kept = Rendered(200, b'{"id":"x","output":"a"}', (("X", "y"),), (0.01, 0.02), 0.1,
                    "topics@v2")
    assert outcome_of(pickle.loads(pickle.dumps(outcome_message(7, kept)))) == kept


def test_an_answer_and_a_refusal_cross_the_link_as_they_were() -> None:
    for outcome in (Answered(["a"], (0.01,), 0.1, (3,), 1, "topics@v1"),
                    Rendered(503, b'{"error":{}}', (("Retry-After", "1"),))):
        assert outcome_of(pickle.loads(pickle.dumps(outcome_message(1, outcome)))) == outcome


def test_an_answer_with_guard_verdicts_crosses_the_link_whole() -> None:
    outcome = Answered(["a", None], (0.01, 0.02), 0.1, (3,), 1, "topics@v1",
                       ((1, "safety", "toxic"),), ("leak",))
    assert outcome_of(pickle.loads(pickle.dumps(outcome_message(1, outcome)))) == outcome


def test_a_plain_answer_frame_carries_no_verdicts() -> None:
    message = outcome_message(1, Answered(["a"], (0.01,), 0.1, (3,), 1, "topics@v1"))
    assert len(message) == 8  # as before guards: the hot path's frame is unchanged
