"""Moving a loaded model's weights to host memory and back (what parking and waking do), on
the CPU here: the same calls a GPU host makes, each a no-op move, none failing."""

from __future__ import annotations

import torch

from gpu_pool.models import HOST, move


class Held:
    """A model made as the built-in ones are: a torch module and tensors among its attributes."""

    def __init__(self) -> None:
        self.encoder = torch.nn.Linear(2, 2)
        self.prototypes = torch.ones(3, 2)
        self.name = "not moved"

    def __call__(self, inputs: list[str], /) -> list[str]:
        return inputs


class MovesItself:
    def __init__(self) -> None:
        self.to: list[str] = []

    def move(self, device: str) -> None:
        self.to.append(device)

    def __call__(self, inputs: list[str], /) -> list[str]:
        return inputs


def plain(inputs: list[str]) -> list[str]:
    return inputs


def test_a_model_of_modules_and_tensors_moves_them_and_keeps_the_rest() -> None:
    model = Held()
    before = model.prototypes
    assert move(model, HOST)
    assert model.prototypes.device.type == "cpu" and torch.equal(model.prototypes, before)
    assert next(model.encoder.parameters()).device.type == "cpu"
    assert model.name == "not moved"
    assert move(model, "cpu")  # the wake on a CPU worker: back where it was


def test_a_model_that_moves_itself_is_asked_to() -> None:
    model = MovesItself()
    assert move(model, HOST) and move(model, "cuda")
    assert model.to == ["cpu", "cuda"]


def test_a_plain_function_holds_nothing_to_move() -> None:
    assert not move(plain, HOST)
