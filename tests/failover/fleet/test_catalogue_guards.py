"""The catalogue's keys for guard stages: `pre`, `post`, `guard_mode`, `on_guard_failure`,
`guard_timeout_ms` and `with_input`, their defaults, every refusal with its key path, and
their way through `to_dict`, pickling and the changes made while serving."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from batcher import Tier
from failover.fleet.catalogue import (
    Catalogue,
    CatalogueError,
    ModelConfig,
    VersionConfig,
    load_catalogue,
    parse_catalogue,
)

EXAMPLE = Path(__file__).parents[3] / "examples" / "models-guards.toml"

GUARDED = """
[models.topics]
default = "v1"
pre = ["safety", "pii"]
post = ["leak"]
guard_mode = "parallel"
on_guard_failure = { paid = "open" }
guard_timeout_ms = 250
[models.topics.versions.v1]
spec = "sim"

[models.safety.versions.v1]
spec = "sim"
[models.pii.versions.v1]
spec = "sim"
[models.leak]
with_input = true
[models.leak.versions.v1]
spec = "sim"
"""

# topics guarded by g; {topics} and {g} are added to the two model tables
FILE = '[models.topics]\n{topics}\n[models.topics.versions.v1]\nspec = "sim"\n' \
       '[models.g]\n{g}\n[models.g.versions.v1]\nspec = "sim"\n'


def guarded() -> Catalogue:
    return parse_catalogue(GUARDED)


def model(name: str = "m", **keys: object) -> ModelConfig:
    return ModelConfig(name, "v1", {"v1": VersionConfig("v1", "sim")}, **keys)  # type: ignore[arg-type]


# -- the file ------------------------------------------------------------------------------
def test_the_guard_keys_parse_to_their_settings() -> None:
    topics = guarded().models["topics"]
    assert (topics.pre, topics.post, topics.guard_mode) == (("safety", "pii"), ("leak",),
                                                            "parallel")
    assert dict(topics.on_guard_failure) == {"paid": "open", "free": "closed"}
    assert topics.guard_timeout_s == 0.25
    assert guarded().models["leak"].with_input is True


def test_absent_guard_keys_take_their_defaults() -> None:
    safety = guarded().models["safety"]
    assert (safety.pre, safety.post, safety.guard_mode) == ((), (), "sequential")
    assert dict(safety.on_guard_failure) == {"paid": "closed", "free": "closed"}
    assert (safety.guard_timeout_s, safety.with_input) == (0.3, False)


@pytest.mark.parametrize(("value", "paid", "free"), [
    ('"open"', True, True), ('"closed"', False, False), ("{ free = 'open' }", False, True),
    ("{ paid = 'open', free = 'closed' }", True, False), ("{}", False, False)])
def test_on_guard_failure_is_one_mode_or_one_per_tier(value: str, paid: bool,
                                                      free: bool) -> None:
    topics = parse_catalogue(FILE.format(topics=f"pre = ['g']\non_guard_failure = {value}",
                                         g="")).models["topics"]
    assert (topics.fails_open(Tier.PAID.label), topics.fails_open(Tier.FREE.label)) == (
        paid, free)


def test_a_model_is_a_guard_when_another_names_it() -> None:
    catalogue = guarded()
    assert [n for n in catalogue.models if catalogue.is_guard(n)] == ["safety", "pii", "leak"]
    assert not catalogue.is_guard("topics") and not catalogue.is_guard("nothing")


def test_the_example_file_parses() -> None:
    shipped = load_catalogue(EXAMPLE)
    assert any(m.pre or m.post for m in shipped.models.values())
    assert all(shipped.is_guard(n) for m in shipped.models.values() for n in m.pre + m.post)


INVALID = [
    # (what topics adds, what g adds, the message's opening)
    ("pre = 'g'", "", "models.topics.pre: expected a list of model names, got str"),
    ("post = ['g', 3]", "", "models.topics.post[1]: 3 is not a model name"),
    ("pre = ['g', 'g']", "", "models.topics.pre[1]: g is named twice"),
    ("pre = ['g', 'topics']", "", "models.topics.pre[1]: topics cannot guard itself"),
    ("post = ['topics']", "", "models.topics.post[0]: topics cannot guard itself"),
    ("pre = ['g', 'nope']", "", "models.topics.pre[1]: 'nope' is no model of this catalogue"),
    ("post = ['gg']", "", "models.topics.post[0]: 'gg' is no model of this catalogue: a "
                          "guard is one of its models (models: topics, g)"),
    ("pre = ['g']", "post = ['topics']", "models.topics.pre[0]: g has guards of its own"),
    ("post = ['g']", "pre = ['topics']", "models.topics.post[0]: g has guards of its own"),
    ("guard_mode = 'both'", "", "models.topics.guard_mode: 'both' is not sequential or"),
    ("guard_mode = 1", "", "models.topics.guard_mode: 1 is not sequential or parallel"),
    ("on_guard_failure = 'shut'", "", "models.topics.on_guard_failure: 'shut' is not closed, "
                                      "open or a table of tiers (paid = ..., free = ...)"),
    ("on_guard_failure = true", "", "models.topics.on_guard_failure: True is not closed"),
    ("on_guard_failure = { gold = 'open' }", "",
     "models.topics.on_guard_failure.gold: unknown tier (expected: paid, free)"),
    ("on_guard_failure = { free = 'yes' }", "",
     "models.topics.on_guard_failure.free: 'yes' is not closed or open"),
    ("guard_timeout_ms = 0", "", "models.topics.guard_timeout_ms: 0 is not a number of "
                                 "milliseconds > 0 and at most 60000"),
    ("guard_timeout_ms = -5", "", "models.topics.guard_timeout_ms: -5 is not a number"),
    ("guard_timeout_ms = 60001", "", "models.topics.guard_timeout_ms: 60001 is not a number"),
    ("guard_timeout_ms = nan", "", "models.topics.guard_timeout_ms: nan is not a number"),
    ("guard_timeout_ms = inf", "", "models.topics.guard_timeout_ms: inf is not a number"),
    ("guard_timeout_ms = '300'", "", "models.topics.guard_timeout_ms: '300' is not a number"),
    ("guard_timeout_ms = true", "", "models.topics.guard_timeout_ms: True is not a number"),
    ("", "with_input = 'yes'", "models.g.with_input: 'yes' is not true or false"),
    ("guard_timeout_s = 1", "", "models.topics.guard_timeout_s: unknown key"),
    ("pre_guards = ['g']", "", "models.topics.pre_guards: unknown key"),
]


@pytest.mark.parametrize(("topics", "g", "message"), INVALID)
def test_an_invalid_guard_key_names_its_key_path(topics: str, g: str, message: str) -> None:
    with pytest.raises(CatalogueError) as caught:
        parse_catalogue(FILE.format(topics=topics, g=g))
    assert str(caught.value).startswith(message)


def test_the_longest_guard_timeout_is_taken() -> None:
    topics = parse_catalogue(FILE.format(topics="guard_timeout_ms = 60000", g="")).models
    assert topics["topics"].guard_timeout_s == 60.0


# -- in code -------------------------------------------------------------------------------
def test_a_model_built_in_code_is_held_to_the_file() -> None:
    assert model(pre=["g"], on_guard_failure="open").pre == ("g",)
    assert dict(model(on_guard_failure={"free": "open"}).on_guard_failure) == {
        "paid": "closed", "free": "open"}
    with pytest.raises(CatalogueError, match=r"^models\.m\.guard_timeout_ms: 0 is not"):
        model(guard_timeout_s=0)
    with pytest.raises(CatalogueError, match=r"^models\.m\.pre\[0\]: m cannot guard itself"):
        model(pre=("m",))
    with pytest.raises(CatalogueError, match=r"^models\.m\.post\[0\]: 'g' is no model"):
        Catalogue({"m": model(post=("g",))})


def test_the_guard_settings_cannot_be_changed_in_place() -> None:
    topics = guarded().models["topics"]
    with pytest.raises(TypeError):
        topics.on_guard_failure["free"] = "open"  # type: ignore[index]


def test_to_dict_shows_the_guard_keys_and_builds_the_same_catalogue() -> None:
    view = json.loads(json.dumps(guarded().to_dict()))
    topics = view["models"]["topics"]
    assert {k: topics[k] for k in ("pre", "post", "guard_mode", "on_guard_failure",
                                   "guard_timeout_ms", "with_input")} == {
        "pre": ["safety", "pii"], "post": ["leak"], "guard_mode": "parallel",
        "on_guard_failure": {"paid": "open", "free": "closed"}, "guard_timeout_ms": 250.0,
        "with_input": False}
    assert Catalogue.from_dict(view) == guarded()


def test_a_guarded_catalogue_survives_pickling() -> None:
    again = pickle.loads(pickle.dumps(guarded()))
    assert again == guarded() and again.models["topics"].fails_open("paid")


# -- changes while serving -----------------------------------------------------------------
def test_a_change_of_settings_keeps_the_guards() -> None:
    changed = guarded().with_settings("topics", min_workers=0)
    assert changed.models["topics"].pre == ("safety", "pii")
    assert changed.models["topics"].post == ("leak",) and changed.is_guard("leak")


def test_a_catalogue_without_a_guard_still_named_is_refused() -> None:
    models = {n: m for n, m in guarded().models.items() if n != "pii"}
    with pytest.raises(CatalogueError, match=r"^models\.topics\.pre\[1\]: 'pii' is no model"):
        Catalogue(models)
