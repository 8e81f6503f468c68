"""A request some of whose inputs a guard refused, or let through unguarded (it failed open):
the collation keeps each input's verdict beside the others' outputs, and the answer says
them (422 `refused` when every input was refused, else 200 with null in their place), with
`Guard-Skipped` naming the guards that failed open. A request no guard touched is answered
exactly as before."""

from __future__ import annotations

import jsonschema
import orjson

from api.config import Principal
from api.http import Answered, Collation, Limits, answer_body, document, hot, render
from batcher import Item, ItemId, Overloaded, Refused, Tier


class Ended(Collation):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.ends = 0

    def ended(self) -> None:
        self.ends += 1


def item(collation: Collation, index: int, skipped: tuple[str, ...] = ()) -> Item:
    return Item(ItemId(index), "text", Tier.PAID, 0.0, 10.0, collation, index,
                skipped=skipped)


def answered(outputs: list[str | None], refused: tuple[tuple[int, str, str], ...] = (),
             skipped: tuple[str, ...] = ()) -> Answered:
    return Answered(outputs, (0.01,) * len(outputs), 0.1, (1,), 1, "topics@v1", refused,
                    skipped)


def test_a_refused_input_is_a_verdict_and_the_others_are_still_collated() -> None:
    collation = Ended(3)
    collation.item_done(item(collation, 1), Refused("safety", "toxic"))
    assert not collation.finished
    collation.item_done(item(collation, 2), "c")
    collation.item_done(item(collation, 0), "a")
    assert collation.ends == 1 and collation.error is None
    assert collation.outputs == ["a", None, "c"]
    assert collation.refused == [(1, "safety", "toxic")]


def test_every_input_refused_ends_the_collation_once() -> None:
    collation = Ended(2)
    for index in (1, 0):
        collation.item_done(item(collation, index), Refused("safety", f"r{index}"))
    assert collation.ends == 1 and collation.outputs == [None, None]
    assert sorted(collation.refused or ()) == [(0, "safety", "r0"), (1, "safety", "r1")]


def test_any_other_error_still_fails_the_whole_request() -> None:
    collation = Ended(2)
    failure = Overloaded("the guard could not answer", 1.0)
    collation.item_done(item(collation, 0), failure)
    assert collation.finished and collation.error is failure


def test_guards_that_failed_open_are_named_once_each() -> None:
    collation = Ended(3)
    collation.item_done(item(collation, 0, ("leak",)), "a")
    collation.item_done(item(collation, 1, ("safety", "leak")), Refused("pii", "email"))
    collation.item_done(item(collation, 2), "c")
    assert collation.skipped == ["leak", "safety"]


def test_a_request_no_guard_touched_keeps_nothing_more() -> None:
    collation = Ended(2)
    collation.item_done(item(collation, 0), "a")
    collation.item_done(item(collation, 1), "b")
    assert collation.refused is None and collation.skipped is None


def test_one_input_refused_is_422_refused_naming_the_guard_and_reason_only() -> None:
    response, rid = render(answered([None], ((0, "safety", "toxic"),)), single=True)
    assert response.status_code == 422 and rid is None
    error = orjson.loads(bytes(response.body))["error"]
    assert error["code"] == "refused"
    assert error["refused"] == [{"index": 0, "guard": "safety", "reason": "toxic"}]
    assert set(error) == {"code", "message", "refused"}


def test_some_inputs_refused_is_200_with_null_in_their_place() -> None:
    response, rid = render(answered(["a", None, "c", None],
                                    ((3, "pii", "email"), (1, "safety", "toxic"))), False)
    assert response.status_code == 200 and rid is not None
    body = orjson.loads(bytes(response.body))
    assert body["outputs"] == ["a", None, "c", None] and body["id"] == rid
    assert body["refused"] == [{"index": 1, "guard": "safety", "reason": "toxic"},
                               {"index": 3, "guard": "pii", "reason": "email"}]
    assert list(body)[-1] == "model"  # the access log reads a kept answer's model there


def test_every_input_of_several_refused_is_422_with_the_list() -> None:
    response, _ = render(answered([None, None], ((0, "safety", "a"), (1, "safety", "b"))),
                         False)
    error = orjson.loads(bytes(response.body))["error"]
    assert response.status_code == 422 and error["code"] == "refused"
    assert [r["index"] for r in error["refused"]] == [0, 1]


def test_guards_that_failed_open_are_named_in_guard_skipped() -> None:
    response, _ = render(answered(["a", "b"], skipped=("leak", "safety")), False)
    assert response.status_code == 200
    assert response.headers["guard-skipped"] == "leak, safety"
    assert orjson.loads(bytes(response.body))["outputs"] == ["a", "b"]
    assert "refused" not in orjson.loads(bytes(response.body))


def test_an_answer_no_guard_touched_is_rendered_as_before() -> None:
    response, rid = render(answered(["a", "b"]), False)
    assert response.status_code == 200 and "guard-skipped" not in response.headers
    assert bytes(response.body) == answer_body(["a", "b"], False, rid, "topics@v1")


def test_the_access_log_tells_a_refusal_as_422_refused_with_no_id() -> None:
    who = Principal(Tier.PAID, "acme", "k")
    refused = hot(who, 0.2, answered([None], ((0, "safety", "toxic"),)))
    assert (refused.status, refused.code, refused.id, refused.model) == \
        (422, "refused", None, None)
    some = hot(who, 0.2, answered(["a", None], ((1, "safety", "toxic"),)), "rid")
    assert (some.status, some.code, some.id) == (200, None, "rid")


def test_the_document_describes_null_outputs_and_the_refused_lists() -> None:
    schemas = document(Limits(7, 20, 1 << 20))["components"]["schemas"]
    answer = jsonschema.Draft202012Validator(schemas["Answer"])
    error = jsonschema.Draft202012Validator(schemas["Error"])
    some, _ = render(answered(["a", None], ((1, "safety", "toxic"),)), False)
    every, _ = render(answered([None], ((0, "safety", "toxic"),)), True)
    assert answer.is_valid(orjson.loads(bytes(some.body)))
    assert error.is_valid(orjson.loads(bytes(every.body)))
    assert not answer.is_valid({"id": "x", "outputs": ["a", None], "model": "m",
                                "refused": [{"index": 1, "guard": "g", "reason": "Not A Code"}]})
