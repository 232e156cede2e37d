"""My model, tunable by the orchestrator: an MLP that learns y = sin(3x) from noisy points."""

from __future__ import annotations

import torch
from torch import nn

from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, BaseAdapter


class MyMLPAdapter(BaseAdapter):
    name = "my_mlp"
    workload_class = "supervised"  # GPU-bound: not capped by CPU cores
    model_overhead_mb = 400.0  # CUDA context + weights, gradients and Adam states
    per_sample_mb = 0.01  # activations per sample at the widest layer, with room to spare
    direction = "minimize"
    metric = "val_loss"
    options = {"samples": 4096, "seed": 0}  # --option samples=100000 --option seed=1

    def suggest(self, trial, options):
        return {
            "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
            "hidden": trial.suggest_int("hidden", 8, 256, log=True),
        }

    def calibration_params(self, options):  # the largest model: what plan --calibrate measures
        return {"learning_rate": 1e-3, "hidden": 256}

    def train(self, params, *, epochs, device, options, report):
        torch.manual_seed(options["seed"])  # the data, the first weights, the order: one run
        x = torch.rand(options["samples"], 1) * 4 - 2
        y = torch.sin(3 * x) + 0.1 * torch.randn(x.shape)
        x, y, split = x.to(device), y.to(device), options["samples"] * 4 // 5
        hidden = params["hidden"]
        model = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1)).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=params["learning_rate"], fused=True)
        for epoch in range(epochs):
            for batch in torch.randperm(split).to(device).split(params["batch_size"]):
                loss = nn.functional.mse_loss(model(x[batch]), y[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                val_loss = nn.functional.mse_loss(model(x[split:]), y[split:]).item()
            report(epoch, val_loss)  # the pruner may stop the trial here
        return val_loss


adapter = MyMLPAdapter()
