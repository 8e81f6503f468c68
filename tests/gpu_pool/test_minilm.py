"""The real all-MiniLM-L6-v2 labeller: correct topics, one label per input, batch-independent."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_pool.models.minilm import LABELS, MiniLMLabeller, load

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

TOPICAL = {
    "The striker scored twice in the cup final": "sports",
    "The Lakers beat the Celtics in overtime last night": "sports",
    "Shares of the retailer fell after weak quarterly earnings": "business",
    "The central bank raised interest rates by a quarter point": "business",
    "Apple unveiled a new iPhone with a faster chip": "technology",
    "The startup released an open-source programming framework": "technology",
    "A new vaccine cut infections by half in clinical trials": "health",
    "Doctors warn that the flu season is filling hospitals": "health",
    "Parliament voted to pass the new immigration bill": "politics",
    "The senator announced her campaign for president": "politics",
    "Astronomers discovered a new planet orbiting a distant star": "science",
    "Physicists measured the mass of the neutrino": "science",
    "The movie topped the box office on its opening weekend": "entertainment",
    "The actor won an Oscar for best supporting role": "entertainment",
    "Add the garlic and simmer the tomato sauce for ten minutes": "food",
    "The bakery sells sourdough bread and croissants": "food",
    "Our flight to Rome was delayed but the hotel was lovely": "travel",
    "Tourists flock to the beaches of Bali every summer": "travel",
    "Heavy rain and strong winds are expected tomorrow": "weather",
    "Temperatures will drop below freezing overnight": "weather",
}


@pytest.fixture(scope="module")
def model() -> MiniLMLabeller:
    return load("cpu")


def test_import_has_no_side_effects() -> None:
    code = "import sys, gpu_pool.models.minilm; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_every_label_is_covered() -> None:
    assert set(TOPICAL.values()) == set(LABELS)


@pytest.mark.parametrize(("text", "label"), TOPICAL.items())
def test_topical_sentence_gets_its_label(model: MiniLMLabeller, text: str, label: str) -> None:
    assert model([text]) == [label]


def test_count_and_order_match_input(model: MiniLMLabeller) -> None:
    texts = list(TOPICAL)[::-1]
    out = model(texts)
    assert out == [TOPICAL[t] for t in texts]
    assert all(type(label) is str for label in out)


def test_label_alone_equals_label_in_mixed_batch_of_100(model: MiniLMLabeller) -> None:
    fillers = ["ok", "Meeting moved to 3pm", "lorem ipsum dolor sit amet", "12345", "?!"]
    batch = list(TOPICAL) + [f"{fillers[i % 5]} {i}" for i in range(80)]
    random.Random(0).shuffle(batch)
    out = model(batch)
    assert len(out) == 100
    assert [label for t, label in zip(batch, out, strict=True) if t in TOPICAL] == [
        TOPICAL[t] for t in batch if t in TOPICAL
    ]
    target = "The striker scored twice in the cup final"
    assert out[batch.index(target)] == model([target])[0] == "sports"


def test_empty_and_long_strings_still_get_one_label_each(model: MiniLMLabeller) -> None:
    long_text = ("The economy grew faster than expected this quarter. " * 100)[:5000]
    assert len(long_text) == 5000
    out = model(["", "It will be sunny and warm this weekend", long_text, " "])
    assert len(out) == 4
    assert all(type(label) is str and label in LABELS for label in out)
    assert out[1] == "weather"


def test_empty_batch_returns_empty_list(model: MiniLMLabeller) -> None:
    assert model([]) == []


def test_missing_cuda_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load("cuda")(["Heavy rain and strong winds are expected tomorrow"]) == ["weather"]
