"""Hyperparameter studies for PyTorch models on GPUs, on top of Optuna.

`orchestrator.optimize(objective, n_trials=...)` runs a plain objective(trial, device) through
the VRAM-gated pools and returns the optuna.Study; `orchestrator.plan(...)` says what this host
would run. The command line is `python -m orchestrator`.
"""

from __future__ import annotations

from orchestrator.api import optimize, plan

__version__ = "0.1.0"
__all__ = ["optimize", "plan", "__version__"]
