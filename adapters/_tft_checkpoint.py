"""What the forecaster (`tft`) keeps in a checkpoint, and how its training goes on from one.

Its weights, AdamW's state, the gradient scaler's, the window stream (its generator and the
windows it still holds, so the next epoch draws the batches an unbroken run would), torch's
generators and the best score so far with its epoch (the trial's value). The price series is
not kept: it is read again from the same data and seed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.base import Checkpoint
else:
    torch = LazyImport("torch")


def save(
    checkpoint: Checkpoint | None,
    epoch: int,
    model: torch.nn.Module,
    step: Any,
    stream: Any,
    best: tuple[float, int],
) -> None:
    if checkpoint is None or not checkpoint.due(epoch):
        return
    state: dict[str, Any] = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": step.optimizer.state_dict(),
        "scaler": step.scaler.state_dict(),
        "stream": {"generator": stream.generator.get_state(), "pending": stream.pending},
        "torch": torch.get_rng_state(),
        "best": [float(best[0]), int(best[1])],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    checkpoint.save(epoch, state)


def resume(
    checkpoint: Checkpoint | None, model: torch.nn.Module, step: Any, stream: Any
) -> tuple[float, int, int]:
    """(best score, its epoch, the epoch to start at) after loading the latest state, if any."""
    state = None if checkpoint is None else checkpoint.load()
    if state is None:
        return math.inf, 0, 0
    model.load_state_dict(state["model"])
    step.optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:
        step.scaler.load_state_dict(state["scaler"])
    stream.generator.set_state(state["stream"]["generator"])
    stream.pending = state["stream"]["pending"]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    best, best_epoch = state["best"]
    return float(best), int(best_epoch), int(state["epoch"]) + 1
