"""A user's own model whose width is a parameter (`width`), checkpointing its weights: the
population-based-training fault tests' model (tests/test_pbt_faults.py).

A two-layer MLP on a few hundred points of y = sin(3x), on the CPU. Its checkpoint is the
model's `state_dict`, loaded with `load_state_dict`: a member whose width differs from its
parent's fails there with torch's "size mismatch", as a real model does. Its widths (64 to 4096,
log) are wide enough that a copied member's perturbed width is another one. `--option
epoch_seconds=S` makes each epoch last at least S seconds, so a test can kill a trial mid-segment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from adapters.base import BaseAdapter


class WidthAdapter(BaseAdapter):
    name = "width-mlp"
    workload_class = "supervised"
    model_overhead_mb = 200.0
    per_sample_mb = 0.01
    direction = "minimize"
    metric = "val_loss"
    options = {"epoch_seconds": 0.0}

    def suggest(self, trial: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "learning_rate": trial.suggest_float("learning_rate", 1e-3, 0.3, log=True),
            "batch_size": trial.suggest_int("batch_size", 16, 256, log=True),
            # Wide, in fine steps: a perturbation (x0.8 or x1.2, at least one step) changes it
            # unless it sits at a bound (about 1 member in 90 starts there), and a resample
            # draws the same width less than once in 250.
            "width": trial.suggest_int("width", 64, 4096, log=True),
        }

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: str,
        options: Mapping[str, Any],
        report: Any,
        checkpoint: Any = None,
    ) -> float:
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(320, 1, generator=generator) * 4 - 2
        y = torch.sin(3 * x) + 0.1 * torch.randn(x.shape, generator=generator)
        width = int(params["width"])
        model = nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=float(params["learning_rate"]))
        state = None if checkpoint is None else checkpoint.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])  # another width: "size mismatch"
            start = int(state["epoch"]) + 1
        val = float("nan")
        for epoch in range(start, epochs):
            began = time.monotonic()
            for batch in torch.randperm(256).split(int(params["batch_size"])):
                loss = nn.functional.mse_loss(model(x[batch]), y[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                val = nn.functional.mse_loss(model(x[256:]), y[256:]).item()
            time.sleep(max(0.0, float(options["epoch_seconds"]) - (time.monotonic() - began)))
            report(epoch, val)
            if checkpoint is not None:
                checkpoint.save(epoch, {"epoch": epoch, "model": model.state_dict()})
        return val


adapter = WidthAdapter()
