"""Hyperparameter studies for PyTorch models on GPUs, on top of Optuna.

`orchestrator.optimize(objective, n_trials=...)` runs a plain objective(trial, device) through
the VRAM-gated pools and returns the optuna.Study; `orchestrator.plan(...)` says what this host
would run; `orchestrator.recommend(study)` names the trial whose configuration a model of all
the trials expects best (not the luckiest draw, as `study.best_trial` is);
`orchestrator.load_checkpoint(path)` reads the weights file `best` names. The command line is
`python -m orchestrator`.
"""

from __future__ import annotations

import contextlib
import sys

from orchestrator.imports import ForeignPackage, load_own_packages

_COMMAND = bool(sys.argv) and sys.argv[0] == "-m"  # `python -m orchestrator`, not an import
if _COMMAND:  # Ctrl-C or SIGTERM while the imports below run: one line, not a traceback
    from orchestrator import interrupts

    interrupts.install()

with interrupts.stopped_quietly() if _COMMAND else contextlib.nullcontext():
    try:
        load_own_packages()  # before anything imports `adapters`, `samplers` or `migrations`
    except ForeignPackage as error:
        if _COMMAND:  # one line, not a traceback
            sys.stderr.write(f"error: {error}\n")
            raise SystemExit(2) from None
        raise

__version__ = "0.1.0"
__all__ = ["optimize", "plan", "recommend", "recommend_front", "load_checkpoint", "__version__"]


def __getattr__(name: str) -> object:
    """`orchestrator.optimize`, `orchestrator.plan`, `orchestrator.recommend`,
    `orchestrator.recommend_front` and `orchestrator.load_checkpoint`, loaded on first use: every command and every trial process
    imports this package first, and most never call the Python API."""
    if name in ("optimize", "plan"):
        from orchestrator import api

        return getattr(api, name)
    if name == "load_checkpoint":  # torch is loaded by the call, not by the name
        from orchestrator import checkpoints

        return checkpoints.load_checkpoint
    if name in ("recommend", "recommend_front"):
        import samplers

        return getattr(samplers, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
