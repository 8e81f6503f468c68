"""Moving a loaded model's weights between its device and host memory: what a parked worker
gives back (`gpu_pool.protocol.Park`) and what waking it takes again.

On the CPU there is nothing to give back and a move costs nothing: the same code runs here
and on a GPU host, so the fallback is the path the tests take.
"""

from __future__ import annotations

import sys

HOST = "cpu"


def move(model: object, device: str) -> bool:
    """Move `model`'s weights to `device`; whether it held any to move. A model with a
    `move(device)` method moves itself; otherwise every torch module and tensor among its
    attributes moves (the built-in models are made of those). A model holding none (a
    user's plain function) stays as it is: parked, it keeps what it holds."""
    own = getattr(model, "move", None)
    if callable(own):
        own(device)
        return True
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(model, "__dict__"):
        return False
    moved = False
    for name, value in list(vars(model).items()):
        if isinstance(value, torch.nn.Module):
            value.to(device)
            moved = True
        elif isinstance(value, torch.Tensor):
            setattr(model, name, value.to(device))
            moved = True
    if moved and device == HOST and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # what the weights held goes back to the device, not a cache
    return moved


__all__ = ["HOST", "move"]
