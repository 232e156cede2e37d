"""A plain Optuna objective, tuned through the orchestrator's GPU pools.

    python examples/python_api/tune_mlp.py                  # on this host's GPUs
    python examples/python_api/tune_mlp.py sim:24576        # on a simulated 24 GB GPU

Compared with the same script on Optuna alone (docs/python-api.md), three lines changed: the
objective takes the trial's `device`, `study.optimize(objective, n_trials=...)` became
`orchestrator.optimize(objective, n_trials=..., memory_model=..., batch_sizes=...)`, and the
call sits under `if __name__ == "__main__":` because trial processes import this module.
"""

from __future__ import annotations

import sys

import torch


def objective(trial, device):
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    width = trial.suggest_int("width", 8, 128, log=True)
    batch_size = trial.suggest_int("batch_size", 64, 4096, log=True)

    torch.manual_seed(0)
    x = torch.linspace(-3, 3, 8192, device=device).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn_like(x)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(5):
        for start in range(0, len(x), batch_size):
            batch = slice(start, start + batch_size)
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            value = torch.nn.functional.mse_loss(model(x), y).item()
        trial.report(value, epoch)
        if trial.should_prune():
            import optuna

            raise optuna.TrialPruned()
    return value


if __name__ == "__main__":
    import orchestrator

    study = orchestrator.optimize(
        objective,
        n_trials=12,
        storage="sqlite:///mlp.db",
        gpus=sys.argv[1] if len(sys.argv) > 1 else "auto",
        memory_model=(300.0, 0.05),  # MB per trial, MB per sample of a batch
        batch_sizes=(64, 4096),
        epochs=5,
        metric="mse",
    )
    print(f"best mse {study.best_value:.4f} with {study.best_params}")
