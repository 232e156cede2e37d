"""A plain Optuna script with a sampler object, a callback and two objectives, on the GPU pools.

    python examples/python_api/tune_two_objectives.py             # on this host's GPUs
    python examples/python_api/tune_two_objectives.py sim:24576   # on a simulated 24 GB GPU

The objective returns two values, the model's error and its size, as an Optuna objective of
two directions does; `objectives=` names them and adds the trial's wall seconds, which the
orchestrator measures of every trial. `best` prints the Pareto front.
"""

from __future__ import annotations

import sys

import optuna
import torch


def objective(trial, device):
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    width = trial.suggest_int("width", 4, 64, log=True)
    batch_size = trial.suggest_int("batch_size", 64, 1024, log=True)

    torch.manual_seed(0)
    x = torch.linspace(-3, 3, 4096, device=device).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn_like(x)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(3):
        for start in range(0, len(x), batch_size):
            batch = slice(start, start + batch_size)
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        mse = torch.nn.functional.mse_loss(model(x), y).item()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"lr={lr:.4g} width={width} batch={batch_size}: mse {mse:.4f}, {n_params} parameters")
    return mse, n_params


def show(study, trial):  # called here, in the script's process, as each trial finishes
    values = "-" if trial.values is None else ", ".join(f"{v:.4g}" for v in trial.values)
    print(f"trial {trial.number} {trial.state.name}: {values}")


if __name__ == "__main__":
    import orchestrator

    study = orchestrator.optimize(
        objective,
        n_trials=10,
        storage="sqlite:///mlp2.db",
        gpus=sys.argv[1] if len(sys.argv) > 1 else "auto",
        memory_model=(300.0, 0.05),
        batch_sizes=(64, 1024),
        directions=["minimize", "minimize"],
        objectives=["mse", "n_params", "seconds"],
        sampler=optuna.samplers.NSGAIISampler(seed=1, population_size=6),
        callbacks=[show],
    )
    for trial in study.best_trials:
        print(f"front: trial {trial.number} {trial.values} {trial.params}")
