"""The model catalogue: its file format, its checks, which version a request gets, and the
changes made while serving."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pickle
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import VersionKey
from failover.fleet.catalogue import (
    Catalogue,
    CatalogueError,
    ModelConfig,
    NotInCatalogue,
    VersionConfig,
    check_change,
    choose,
    load_catalogue,
    parse_catalogue,
)

EXAMPLE = Path(__file__).parents[3] / "examples" / "models.toml"

ISSUE = """
[models.topics]
default = "v1"
weights = { v1 = 90, v2 = 10 }
min_workers = 1
max_workers = 4
idle_unload_s = 600

[models.topics.versions.v1]
spec = "minilm"
[models.topics.versions.v2]
spec = "mypkg.topics_v2:batchstring"
load_s = 40

[models.echo]
min_workers = 0
[models.echo.versions.a]
spec = "sim"
"""

KEYS = [f"key-{i}" for i in range(2000)]


def catalogue() -> Catalogue:
    return parse_catalogue(ISSUE)


def share(versions: list[str], version: str) -> float:
    return versions.count(version) / len(versions)


# -- the file -----------------------------------------------------------------------------
def test_the_issue_shape_parses_to_its_settings() -> None:
    topics = catalogue().models["topics"]
    assert (topics.default, dict(topics.weights)) == ("v1", {"v1": 90, "v2": 10})
    assert (topics.min_workers, topics.max_workers, topics.idle_unload_s) == (1, 4, 600.0)
    assert topics.versions["v2"] == VersionConfig("v2", "mypkg.topics_v2:batchstring", 40.0)
    assert topics.versions["v1"].load_s is None


def test_absent_settings_take_their_defaults() -> None:
    echo = catalogue().models["echo"]
    assert (echo.default, dict(echo.weights), echo.max_workers, echo.idle_unload_s) == (
        "a", {}, None, 600.0)


def test_models_and_versions_keep_the_file_order() -> None:
    assert list(catalogue().models) == ["topics", "echo"]
    assert catalogue().versions() == ("topics@v1", "topics@v2", "echo@a")


def test_the_example_file_parses() -> None:
    shipped = load_catalogue(EXAMPLE)
    assert shipped.versions() == ("topics@v1", "topics@v2", "sentiment@v1")
    assert shipped.models["sentiment"].min_workers == 0
    assert dict(shipped.models["topics"].weights) == {"v1": 90, "v2": 10}


MODEL = '[models.m]\ndefault = "v1"\n{model}\n[models.m.versions.v1]\nspec = "sim"\n{v1}\n' \
        '[models.m.versions.v2]\nspec = "sim"\n'

INVALID = [
    # (what the model table adds, what version v1 adds, the message's opening)
    ("min_wrkers = 1", "", "models.m.min_wrkers: unknown key"),
    ("", "sepc = 'sim'", "models.m.versions.v1.sepc: unknown key"),
    ("weights = { v1 = 90, v3 = 10 }", "", "models.m.weights: v3 is not a version of m"),
    ("weights = { v1 = 90, v2 = 20 }", "", "models.m.weights: the weights add up to 110"),
    ("weights = { v1 = 110, v2 = -10 }", "", "models.m.weights: v2 = -10 is not a whole"),
    ("weights = { v1 = 90.0, v2 = 10 }", "", "models.m.weights: v1 = 90.0 is not a whole"),
    ("weights = { v1 = true, v2 = 99 }", "", "models.m.weights: v1 = True is not a whole"),
    ("weights = { v1 = 100 }", "retired = true", "models.m.default: v1 is retired"),
    ("weights = 100", "", "models.m.weights: expected a table"),
    ("min_workers = -1", "", "models.m.min_workers: -1 is not a whole number >= 0"),
    ("min_workers = 1.5", "", "models.m.min_workers: 1.5 is not a whole number"),
    ("min_workers = '1'", "", "models.m.min_workers: '1' is not a whole number"),
    ("max_workers = 0\nmin_workers = 0", "", "models.m.max_workers: 0 is not a whole number >= 1"),
    ("max_workers = 2\nmin_workers = 3", "", "models.m.max_workers: 2 is not a whole number >= 3"),
    ("idle_unload_s = 0", "", "models.m.idle_unload_s: 0 is not a number of seconds > 0"),
    ("idle_unload_s = -5.0", "", "models.m.idle_unload_s: -5.0 is not a number"),
    ("idle_unload_s = nan", "", "models.m.idle_unload_s: nan is not a number"),
    ("idle_unload_s = 'long'", "", "models.m.idle_unload_s: 'long' is not a number"),
    ("", "load_s = 0", "models.m.versions.v1.load_s: 0 is not a number of seconds > 0"),
    ("", "load_s = inf", "models.m.versions.v1.load_s: inf is not a number"),
    ("", "load_s = true", "models.m.versions.v1.load_s: True is not a number"),
    ("", "retired = 'yes'", "models.m.versions.v1.retired: 'yes' is not true or false"),
    ("", "start = 'warm'", "models.m.versions.v1.start: 'warm' is not one of fork, preload, "
                           "spawn"),
]


def test_a_version_says_how_its_workers_start() -> None:
    starts = {start: parse_catalogue(MODEL.format(model="", v1=f"start = '{start}'"))
              .models["m"].versions["v1"].start for start in ("fork", "preload", "spawn")}
    assert starts == {"fork": "fork", "preload": "preload", "spawn": "spawn"}
    assert parse_catalogue(MODEL.format(model="", v1="")).models["m"].versions["v1"].start == \
        "fork"


@pytest.mark.parametrize(("model", "v1", "message"), INVALID)
def test_an_invalid_setting_names_its_key_path(model: str, v1: str, message: str) -> None:
    with pytest.raises(CatalogueError) as caught:
        parse_catalogue(MODEL.format(model=model, v1=v1))
    assert str(caught.value).startswith(message)


WHOLE_FILES = [
    ("models = {}", "models: the catalogue needs at least one model"),
    ("", "models: the catalogue needs at least one model"),
    ("model = 1", "model: unknown key (expected: models)"),
    ("models = 3", "models: expected a table, got int"),
    ("[models]\ntopics = 3", "models.topics: expected a table, got int"),
    ("[models.m]\ndefault = 'v1'", "models.m.versions: a model needs at least one version"),
    ("[models.m.versions]\nv1 = 'sim'", "models.m.versions.v1: expected a table, got str"),
    ("[models.m.versions.v1]\nload_s = 3", "models.m.versions.v1.spec: missing"),
    ("[models.m.versions.v1]\nspec = 'not a spec'", "models.m.versions.v1.spec: model 'not a sp"),
    ("[models.m.versions.v1]\nspec = 7", "models.m.versions.v1.spec: 7 is not a string"),
    ("[models.m.versions.v1]\nspec = 'sim'\n[models.m.versions.v2]\nspec = 'sim'",
     "models.m.default: missing"),
    ("[models.m]\ndefault = 'v9'\n[models.m.versions.v1]\nspec = 'sim'",
     "models.m.default: 'v9' is not a version of m (versions: v1)"),
    ("[models.'to@pics'.versions.v1]\nspec = 'sim'", "models: 'to@pics' is not a model name"),
    ("[models.'a b'.versions.v1]\nspec = 'sim'", "models: 'a b' is not a model name"),
    ("[models.m.versions.'v@1']\nspec = 'sim'", "models.m.versions: 'v@1' is not a version name"),
    ("[models.m.versions.'']\nspec = 'sim'", "models.m.versions: '' is not a version name"),
    ("[models.m\n", "not valid TOML: "),
]


@pytest.mark.parametrize(("text", "message"), WHOLE_FILES)
def test_an_invalid_file_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(CatalogueError) as caught:
        parse_catalogue(text)
    assert str(caught.value).startswith(message)


def test_a_catalogue_error_is_a_value_error() -> None:
    assert issubclass(CatalogueError, ValueError)
    assert issubclass(NotInCatalogue, LookupError)


def test_a_missing_file_is_a_catalogue_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match=r"models file .*nowhere\.toml: .*No such file"):
        load_catalogue(tmp_path / "nowhere.toml")


def test_an_invalid_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(MODEL.format(model="weights = { v1 = 50 }", v1=""))
    with pytest.raises(CatalogueError, match=r"models file .*models\.toml: models\.m\.weights"):
        load_catalogue(str(path))


def test_a_file_that_is_not_utf8_is_a_catalogue_error(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_bytes(b"\xff\xfe[models]")
    with pytest.raises(CatalogueError, match="models file"):
        load_catalogue(path)


# -- frozen objects ----------------------------------------------------------------------
def test_a_catalogue_cannot_be_changed_in_place() -> None:
    topics = catalogue().models["topics"]
    with pytest.raises(TypeError):
        topics.weights["v1"] = 0  # type: ignore[index]
    with pytest.raises(TypeError):
        catalogue().models["x"] = topics  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        topics.default = "v2"  # type: ignore[misc]


def test_a_catalogue_does_not_share_the_callers_dicts() -> None:
    weights = {"a": 100}
    model = ModelConfig("m", "a", {"a": VersionConfig("a", "sim")}, weights)
    weights["a"] = 0
    assert model.weights["a"] == 100


def test_a_catalogue_survives_pickling() -> None:
    assert pickle.loads(pickle.dumps(catalogue())) == catalogue()


def test_to_dict_is_json_and_builds_the_same_catalogue() -> None:
    view = json.loads(json.dumps(catalogue().to_dict()))
    assert view["models"]["topics"]["versions"]["v2"] == {
        "spec": "mypkg.topics_v2:batchstring", "load_s": 40.0, "retired": False,
        "start": "fork"}
    assert Catalogue.from_dict(view) == catalogue()


def test_from_dict_checks_as_the_file_does() -> None:
    with pytest.raises(CatalogueError, match=r"^catalogue: expected a table, got list"):
        Catalogue.from_dict([])


# -- keys --------------------------------------------------------------------------------
def test_a_key_joins_and_splits() -> None:
    made = VersionKey.of("topics", "v2")
    assert made == "topics@v2" and (made.model, made.version) == ("topics", "v2")
    parsed = VersionKey.parse("topics@v2")
    assert parsed == made and (parsed.model, parsed.version) == ("topics", "v2")
    assert Catalogue.single("sim").versions() == (VersionKey.of("default", "v1"),)


@pytest.mark.parametrize("bad", ["topics", "topics@", "@v1", "a@b@c", ""])
def test_parse_refuses_what_is_not_a_key(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a version key"):
        VersionKey.parse(bad)


@pytest.mark.parametrize(("model", "version"), [("a@b", "v1"), ("topics", ""), ("t p", "v")])
def test_of_refuses_what_is_not_a_name(model: str, version: str) -> None:
    with pytest.raises(ValueError, match="are names"):
        VersionKey.of(model, version)


def test_config_of_gives_the_model_and_version() -> None:
    model, version = catalogue().config_of(VersionKey.parse("topics@v2"))
    assert (model.name, version.spec) == ("topics", "mypkg.topics_v2:batchstring")
    with pytest.raises(NotInCatalogue):
        catalogue().config_of(VersionKey.parse("topics@v9"))


# -- resolve -----------------------------------------------------------------------------
def test_no_model_named_gets_the_first_model() -> None:
    assert catalogue().resolve(None, "k").startswith("topics@")
    flipped = Catalogue({"echo": catalogue().models["echo"], **catalogue().models})
    assert flipped.resolve(None) == "echo@a"


def test_a_model_without_weights_gets_its_default() -> None:
    assert {catalogue().resolve("echo", k) for k in KEYS[:50]} == {"echo@a"}
    assert catalogue().resolve("echo") == "echo@a"


def test_a_named_version_is_served_as_named() -> None:
    assert {catalogue().resolve("topics@v2", k) for k in KEYS[:50]} == {"topics@v2"}


@pytest.mark.parametrize(("requested", "message"), [
    ("nope", "model 'nope' is not served (models: topics, echo)"),
    ("", "model '' is not served"),
    ("topics@v9", "model topics has no live version 'v9' (live: v1, v2)"),
    ("topics@", "model topics has no live version ''"),
    ("topics@v1@v2", "model topics has no live version 'v1@v2'"),
    ("x" * 10_000, "model 'xxxxxxxx"),
])
def test_an_unknown_model_or_version_is_refused(requested: str, message: str) -> None:
    with pytest.raises(NotInCatalogue) as caught:
        catalogue().resolve(requested, "k")
    assert str(caught.value).startswith(message)
    assert len(str(caught.value)) < 200


def test_a_retired_version_is_refused_by_name() -> None:
    retired = catalogue().retire("topics", "v2")
    with pytest.raises(NotInCatalogue, match="no live version 'v2'"):
        retired.resolve("topics@v2")


def test_weights_split_requests_within_three_points() -> None:
    got = [catalogue().resolve("topics", k) for k in KEYS]
    assert abs(share(got, "topics@v1") - 0.90) <= 0.03
    assert abs(share(got, "topics@v2") - 0.10) <= 0.03


def test_the_same_key_always_gets_the_same_version() -> None:
    first = [catalogue().resolve("topics", k) for k in KEYS[:200]]
    assert [catalogue().resolve("topics", k) for k in KEYS[:200]] == first
    assert len(set(first)) == 2


def test_without_a_key_the_choice_is_random() -> None:
    rng = random.Random(7)
    got = [catalogue().resolve("topics", None, rng=rng) for _ in range(2000)]
    assert abs(share(got, "topics@v2") - 0.10) <= 0.03


# -- choose ------------------------------------------------------------------------------
def test_choose_is_a_keyed_blake2b_of_the_key() -> None:
    for k in KEYS[:100]:
        digest = hashlib.blake2b(k.encode(), digest_size=8, person=b"batchgate.models")
        point = int.from_bytes(digest.digest(), "big") % 100
        assert choose({"a": 30, "b": 70}, k) == ("a" if point < 30 else "b")


def test_choose_is_the_same_in_another_process() -> None:
    code = ("import sys; from failover.fleet.catalogue import choose; "
            "print(''.join(choose({'a': 50, 'b': 50}, f'key-{i}') for i in range(300)))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, check=True, timeout=60).stdout.strip()
    assert there == "".join(choose({"a": 50, "b": 50}, f"key-{i}") for i in range(300))


def test_choose_ignores_the_order_weights_are_written_in() -> None:
    assert [choose({"a": 10, "b": 90}, k) for k in KEYS[:300]] == [
        choose({"b": 90, "a": 10}, k) for k in KEYS[:300]]


def test_choose_never_picks_a_zero_weight() -> None:
    assert {choose({"a": 0, "b": 100, "c": 0}, k) for k in KEYS} == {"b"}


def test_choose_takes_any_string_as_a_key() -> None:
    assert choose({"a": 100}, "\ud800 lone surrogate") == "a"


def test_choose_refuses_weights_without_weight() -> None:
    with pytest.raises(ValueError, match="no weight"):
        choose({"a": 0}, "k")


@st.composite
def percents(draw: st.DrawFn) -> dict[str, int]:
    """Weights over 1..5 versions adding up to 100."""
    cuts = sorted(draw(st.lists(st.integers(0, 100), max_size=4)))
    bounds = [0, *cuts, 100]
    return {f"v{i}": hi - lo for i, (lo, hi) in enumerate(itertools.pairwise(bounds))}


@settings(max_examples=50, deadline=None)
@given(percents())
def test_any_weights_give_each_version_its_share(weights: dict[str, int]) -> None:
    got = Counter(choose(weights, f"key-{i}") for i in range(4000))
    for version, weight in weights.items():
        assert abs(got[version] / 4000 - weight / 100) <= 0.035


# -- changes while serving ----------------------------------------------------------------
def test_retire_drops_the_version_and_gives_its_share_to_the_default() -> None:
    retired = catalogue().retire("topics", "v2")
    assert dict(retired.models["topics"].weights) == {"v1": 100}
    assert retired.versions() == ("topics@v1", "echo@a")
    assert retired.config_of(VersionKey.parse("topics@v2"))[1].retired
    assert catalogue().versions() == ("topics@v1", "topics@v2", "echo@a")  # a new one


def test_retiring_the_only_weighted_version_leaves_the_default_alone() -> None:
    canary = catalogue().with_settings("topics", weights={"v2": 100})
    after = canary.retire("topics", "v2")
    assert dict(after.models["topics"].weights) == {}
    assert {after.resolve("topics", k) for k in KEYS[:50]} == {"topics@v1"}


def test_retiring_twice_changes_nothing() -> None:
    once = catalogue().retire("topics", "v2")
    assert once.retire("topics", "v2") is once


def test_the_default_cannot_be_retired() -> None:
    with pytest.raises(CatalogueError, match="make another version the default first"):
        catalogue().retire("topics", "v1")


def test_the_last_live_version_cannot_be_retired() -> None:
    with pytest.raises(CatalogueError, match="last live version of echo"):
        catalogue().retire("echo", "a")


def test_retiring_an_unknown_version_is_unknown() -> None:
    with pytest.raises(NotInCatalogue):
        catalogue().retire("topics", "v9")
    with pytest.raises(NotInCatalogue):
        catalogue().retire("nope", "v1")


def test_with_settings_returns_a_new_catalogue() -> None:
    changed = catalogue().with_settings("topics", default="v2", weights={}, min_workers=2,
                                        max_workers=8)
    topics = changed.models["topics"]
    assert (topics.default, dict(topics.weights), topics.min_workers, topics.max_workers) == (
        "v2", {}, 2, 8)
    assert changed.resolve("topics", "k") == "topics@v2"
    assert catalogue().models["topics"].default == "v1"
    assert list(changed.models) == ["topics", "echo"]


def test_with_settings_leaves_unnamed_settings_alone() -> None:
    assert catalogue().with_settings("topics") == catalogue()


@pytest.mark.parametrize(("change", "message"), [
    ({"weights": {"v1": 50}}, "models.topics.weights: the weights add up to 50"),
    ({"default": "v9"}, "models.topics.default: 'v9' is not a version of topics"),
    ({"min_workers": 5}, "models.topics.max_workers: 4 is not a whole number >= 5"),
    ({"max_workers": "lots"}, "models.topics.max_workers: 'lots' is not"),
])
def test_with_settings_checks_as_the_file_does(change: Mapping[str, object], message: str
                                                ) -> None:
    with pytest.raises(CatalogueError) as caught:
        catalogue().with_settings("topics", **change)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message)


def test_a_retired_version_cannot_become_the_default_or_take_weight() -> None:
    retired = catalogue().retire("topics", "v2")
    with pytest.raises(CatalogueError, match=r"models\.topics\.default: v2 is retired"):
        retired.with_settings("topics", default="v2")
    with pytest.raises(CatalogueError, match=r"models\.topics\.weights: v2 is retired"):
        retired.with_settings("topics", weights={"v1": 50, "v2": 50})


def test_with_settings_of_an_unknown_model_is_unknown() -> None:
    with pytest.raises(NotInCatalogue, match="'nope' is not served"):
        catalogue().with_settings("nope", min_workers=0)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_resolve_never_returns_a_retired_version(data: st.DataObject) -> None:
    cat = catalogue().with_settings("topics", weights=data.draw(
        st.sampled_from([{}, {"v1": 90, "v2": 10}, {"v2": 100}, {"v1": 0, "v2": 100}])))
    if data.draw(st.booleans()):
        cat = cat.retire("topics", "v2")
    for k in data.draw(st.lists(st.text(max_size=20) | st.none(), min_size=1, max_size=20)):
        for requested in (None, "topics", "echo"):
            got = cat.resolve(requested, k)
            assert got in cat.versions()
            assert not cat.config_of(got)[1].retired


# -- the one-model shorthand and the pool -----------------------------------------------
def test_single_is_one_model_named_default() -> None:
    one = Catalogue.single("sim")
    assert one.versions() == ("default@v1",)
    assert one.resolve(None, "k") == one.resolve("default") == "default@v1"
    assert one.models["default"].min_workers == 1
    assert one.config_of(VersionKey.parse("default@v1"))[1].spec == "sim"


def test_single_refuses_a_bad_spec() -> None:
    with pytest.raises(CatalogueError, match=r"^--model: model 'no spec'"):
        Catalogue.single("no spec")


@pytest.mark.parametrize(("text", "path"), [
    (f"[models.{'m' * 65}.versions.v1]\nspec = 'sim'", "models: "),
    (f"[models.m.versions.{'v' * 65}]\nspec = 'sim'", "models.m.versions: "),
], ids=["model", "version"])
def test_a_name_longer_than_a_request_can_name_is_refused_with_its_path(
        text: str, path: str) -> None:
    """A request names at most 64 characters a part: a longer name would load, never serve."""
    with pytest.raises(CatalogueError) as caught:
        parse_catalogue(text)
    assert str(caught.value).startswith(path) and "it has 65 characters" in str(caught.value)
    parse_catalogue(text.replace("m" * 65, "m" * 64).replace("v" * 65, "v" * 64))


def test_a_new_catalogue_may_not_change_a_versions_spec_under_its_name() -> None:
    changed = ISSUE.replace('spec = "minilm"', 'spec = "sim"')
    with pytest.raises(CatalogueError, match=r"^models\.topics\.versions\.v1\.spec: changed "
                                             r"from 'minilm' to 'sim'.*new version"):
        check_change(catalogue(), parse_catalogue(changed))
    added = changed.replace("[models.topics.versions.v1]", "[models.topics.versions.v3]")
    check_change(catalogue(), parse_catalogue(added.replace('default = "v1"', 'default = "v3"')
                                              .replace("v1 = 90", "v3 = 90")))
