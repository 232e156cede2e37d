"""`Weights`: a small network's parameters in one flat tensor, for the DQN and PPO networks.

torch is imported inside the methods, so that listing adapters and `plan` do not import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch
else:
    torch = LazyImport("torch")


class Weights:
    """A small network's parameters as views into one flat tensor, their gradients into another.

    The layers are plain functions of these views (`torch.nn.functional`), so each algorithm's
    file shows its network in a few lines. One tensor makes zeroing, clipping and Adam's step
    one operation each instead of one per layer: on networks this small that bookkeeping costs
    as much as the matrix products. Backward accumulates into each view's `.grad`, which is a
    view into `grad`, in place.
    """

    def __init__(
        self, shapes: Mapping[str, tuple[int, ...]], device: torch.device, *, trainable: bool = True
    ) -> None:
        self.shapes = dict(shapes)
        sizes = [math.prod(shape) for shape in shapes.values()]
        self.flat = torch.zeros(sum(sizes), device=device)
        self.grad = torch.zeros_like(self.flat)
        self.flat.grad = self.grad  # what the optimiser steps
        self.views: dict[str, torch.Tensor] = {}
        pieces = zip(self.flat.split(sizes), self.grad.split(sizes), strict=True)
        for (name, shape), (value, grad) in zip(shapes.items(), pieces, strict=True):
            view = value.view(shape)
            if trainable:
                view.requires_grad_()
                view.grad = grad.view(shape)
            self.views[name] = view

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.views[name]

    def frozen_copy(self) -> Weights:
        """A copy that takes no gradients (a target network); refresh it with `flat.copy_`."""
        copy = Weights(self.shapes, self.flat.device, trainable=False)
        copy.flat.copy_(self.flat)
        return copy

    def init_like_linear(self) -> None:
        """torch.nn.Linear's default: weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

        Each bias follows its weight in `shapes`, so a bias takes the fan-in of the one before.
        """
        fan_in = 1
        with torch.no_grad():
            for view in self.views.values():
                fan_in = view.shape[1] if view.dim() == 2 else fan_in
                view.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    def optimizer(self, learning_rate: float, **kwargs: Any) -> torch.optim.Adam:
        fused = self.flat.device.type in ("cpu", "cuda")
        return torch.optim.Adam([self.flat], lr=learning_rate, fused=fused, **kwargs)

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clip_grad_norm(self, max_norm: float) -> None:
        """As torch.nn.utils.clip_grad_norm_: scale all gradients so their L2 norm is at most max_norm."""
        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_((max_norm / (norm + 1e-6)).clamp_max(1.0))
