"""The model registry: what a name means, asked without loading anything; and loading it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import subprocess
import sys

import pytest

from gpu_pool.models import (
    BUILTIN_MODELS,
    ModelEntry,
    default_latency_floor,
    load_model,
    missing_extra,
    parse_spec,
    uses_gpu,
    validate_spec,
)
from gpu_pool.models.sim import reverse_batch


def test_the_builtin_models_are_minilm_its_guard_and_sim_each_under_its_own_name() -> None:
    assert list(BUILTIN_MODELS) == ["minilm", "minilm-guard", "sim"]
    assert all(name == entry.name for name, entry in BUILTIN_MODELS.items())


def test_minilm_wants_a_gpu_and_no_padding() -> None:
    entry = BUILTIN_MODELS["minilm"]
    assert (entry.uses_gpu, entry.latency_floor) == (True, 0.0)


def test_minilm_guard_is_minilm_s_kind_of_model_choosing_among_its_topics() -> None:
    entry = BUILTIN_MODELS["minilm-guard"]
    assert (entry.uses_gpu, entry.latency_floor, entry.extra) == (True, 0.0, "minilm")
    assert entry.choices == ("violence", "self_harm", "weapons")


def test_sim_wants_no_gpu_and_takes_the_contracts_latency() -> None:
    entry = BUILTIN_MODELS["sim"]
    assert (entry.uses_gpu, entry.latency_floor) == (False, 0.100)


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_each_loader_names_a_function_importable_without_torch(name: str) -> None:
    module, _, func = BUILTIN_MODELS[name].loader.partition(":")
    code = (f"import sys, {module}; assert callable({module}.{func}); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        BUILTIN_MODELS["other"] = BUILTIN_MODELS["sim"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BUILTIN_MODELS["sim"].latency_floor = 0.0  # type: ignore[misc]


def test_asking_the_registry_imports_no_model_and_no_torch() -> None:
    code = ("import sys, gpu_pool.models.registry as r; r.uses_gpu('minilm'); "
            "bad = [m for m in ('torch', 'gpu_pool.models.minilm', 'gpu_pool.models.sim', "
            "'gpu_pool.models.minilm_guard') "
            "if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("spec", ["minilm", "sim", "tests.models:poison", "a.b.c:f"])
def test_a_builtin_name_or_a_module_function_is_valid(spec: str) -> None:
    assert validate_spec(spec) == spec


@pytest.mark.parametrize("spec", ["", "mini", "tests.models", ":f", "tests.models:", "1x:f",
                                  "a..b:f", "a-b:f"])
def test_anything_else_is_refused_naming_what_is_expected(spec: str) -> None:
    with pytest.raises(ValueError,
                       match=r"expected 'minilm', 'minilm-guard', 'sim' or 'module:function'"):
        validate_spec(spec)


@pytest.mark.parametrize("spec", ["minilm-guard:violence", "minilm-guard:weapons,self_harm"])
def test_a_guard_spec_may_pick_some_of_its_topics_in_its_own_order(spec: str) -> None:
    assert validate_spec(spec) == spec
    entry, choices = parse_spec(spec)
    assert entry is BUILTIN_MODELS["minilm-guard"]
    assert choices == tuple(spec.partition(":")[2].split(","))


def test_a_guard_spec_alone_picks_nothing_so_its_loader_takes_every_topic() -> None:
    assert parse_spec("minilm-guard") == (BUILTIN_MODELS["minilm-guard"], ())


@pytest.mark.parametrize(("spec", "why"), [
    ("minilm-guard:nope", "unknown 'nope'"),
    ("minilm-guard:", "unknown ''"),
    ("minilm-guard:violence,", "unknown ''"),
    ("minilm-guard:violence, weapons", "unknown ' weapons'"),
    ("minilm-guard:weapons,weapons", "a choice named twice"),
])
def test_a_guard_spec_naming_an_unknown_topic_is_refused_listing_the_topics(
    spec: str, why: str
) -> None:
    with pytest.raises(ValueError, match=why) as err:
        validate_spec(spec)
    assert "violence,self_harm,weapons" in str(err.value)


def test_a_guard_spec_is_asked_like_its_entry_and_needs_the_minilm_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (default_latency_floor("minilm-guard:weapons"), uses_gpu("minilm-guard:weapons")) == (
        0.0, True)
    assert missing_extra("minilm-guard:weapons") is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert missing_extra("minilm-guard") == missing_extra("minilm-guard:weapons") == "minilm"


def test_a_built_in_loader_gets_the_device_then_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, ...]] = []

    def load(*args: str) -> object:
        calls.append(args)
        return reverse_batch

    monkeypatch.setattr(importlib.import_module("gpu_pool.models.minilm_guard"), "load", load)
    assert load_model("minilm-guard:weapons,violence", "cuda") is reverse_batch
    assert load_model("minilm-guard", "cpu") is reverse_batch
    assert calls == [("cuda", "weapons", "violence"), ("cpu",)]


@pytest.mark.parametrize(("spec", "floor", "gpu"), [
    ("minilm", 0.0, True),
    ("sim", 0.100, False),
    ("tests.models:poison", 0.0, True),  # a user's function: no padding, may use CUDA
])
def test_the_parent_asks_a_name_for_its_floor_and_whether_it_uses_a_gpu(
    spec: str, floor: float, gpu: bool
) -> None:
    assert (default_latency_floor(spec), uses_gpu(spec)) == (floor, gpu)


def test_asking_about_a_malformed_name_is_refused_as_validation_would() -> None:
    with pytest.raises(ValueError, match="expected"):
        default_latency_floor("nope")
    with pytest.raises(ValueError, match="expected"):
        uses_gpu("nope")


def test_an_entry_is_a_frozen_slotted_record() -> None:
    entry = ModelEntry("x", "m:f", latency_floor=0.0, uses_gpu=True)
    assert not hasattr(entry, "__dict__") and entry == dataclasses.replace(entry)


def test_sim_loads_as_the_reversing_model() -> None:
    model = load_model("sim", "cpu")
    assert model is reverse_batch and model(["ab", "c"]) == ["ba", "c"]


def test_a_module_function_loads_as_that_function() -> None:
    assert load_model("tests.models:poison", "cpu") is importlib.import_module(
        "tests.models").poison


def test_a_module_function_that_names_nothing_fails_to_import() -> None:
    with pytest.raises(ModuleNotFoundError):
        load_model("tests.no_such_module:f", "cpu")
    with pytest.raises(AttributeError):
        load_model("tests.models:no_such_function", "cpu")


def test_a_module_attribute_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="not callable"):
        load_model("tests.models:__doc__", "cpu")


def test_a_malformed_name_is_refused_before_anything_is_imported() -> None:
    with pytest.raises(ValueError, match="expected"):
        load_model("nope", "cpu")


def test_a_built_in_model_names_the_extra_it_needs_only_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert missing_extra("minilm") is None  # the suite's environment has it
    assert missing_extra("sim") is None and missing_extra("tests.models:echo") is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert missing_extra("minilm") == "minilm"
    assert missing_extra("sim") is None  # needs nothing
