"""The `minilm-guard` model: a guard that refuses inputs close to a refused topic.

Each input is embedded by the same all-MiniLM-L6-v2 as `minilm` and compared by cosine with
one prototype per refused topic (`guard_topics.TOPICS`: the re-normalized mean embedding of a
few sentences on it). An input whose cosine reaches a topic's threshold is refused with that
topic's name (the one it passes by most when several do), any other is allowed: the verdicts
`"allow"` / `"refuse:<topic>"` a guard answers. The spec picks the topics
(`minilm-guard:violence,weapons`); `minilm-guard` alone refuses all of them. Like `minilm`,
torch is imported only in `load`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_pool.models.guard_topics import TOPICS
from gpu_pool.models.minilm import encode, load_encoder, prototypes

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

ALLOW = "allow"


class MiniLMGuard:
    """Callable batch model: one verdict per input, in input order (see `BatchModel`)."""

    def __init__(self, model: SentenceTransformer, topics: tuple[str, ...],
                 prototypes: torch.Tensor, thresholds: torch.Tensor) -> None:
        self._model = model
        self._refusals = tuple(f"refuse:{topic}" for topic in topics)
        self._prototypes = prototypes  # (len(topics), dim), unit rows, on the model's device
        self._thresholds = thresholds  # (len(topics),), on the model's device

    def __call__(self, inputs: list[str], /) -> list[str]:
        if not inputs:
            return []  # encode() cannot take batch_size=0
        scores = encode(self._model, inputs) @ self._prototypes.T
        # Below its threshold a topic cannot win, however close it is to the others.
        margins = scores - self._thresholds
        best_margin, best = margins.max(dim=1)
        refused: list[bool] = (best_margin >= 0).tolist()
        topics: list[int] = best.tolist()
        return [self._refusals[t] if r else ALLOW for r, t in zip(refused, topics, strict=True)]


def load(device: str, *topics: str) -> MiniLMGuard:
    """Load the bundled model on `device` ("cpu" or "cuda"; no CUDA means CPU) and embed the
    prototypes of `topics` (all of `TOPICS` when none) once. KeyError for a topic not in
    `TOPICS` (the registry refuses such a spec before it gets here)."""
    import torch

    chosen = topics or tuple(TOPICS)
    model = load_encoder(device)
    rows = prototypes(model, [TOPICS[topic].sentences for topic in chosen])
    thresholds = torch.tensor([TOPICS[topic].threshold for topic in chosen],
                              dtype=rows.dtype, device=rows.device)
    return MiniLMGuard(model, chosen, rows, thresholds)


__all__ = ["ALLOW", "MiniLMGuard", "load"]
