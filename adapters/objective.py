"""A plain Optuna objective, `objective(trial, device) -> float` or `objective(trial)`, as an adapter.

An objective of three arguments, `objective(trial, device, checkpoint)`, also gets the trial's
checkpoint handle (docs/checkpoints.md): `checkpoint.load()` and `checkpoint.save(epoch, state)`.

This is how `orchestrator.optimize` runs a function through the GPU pools: the function is
found again in every trial process by its `module:qualname` (so it must be a module-level
function of an importable module), and the study's settings carry its memory model and, when it
draws one, the range of its batch size. A batch size is drawn before the objective runs, so the
supervisor can admit the trial by its footprint; the objective reads it with
`trial.suggest_int("batch_size", low, high, log=True)` over that same range (Optuna returns the
value already drawn) or `trial.params["batch_size"]`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from adapters.base import BaseAdapter, MemoryModel
from orchestrator.record.study.objectives import objective_value

if TYPE_CHECKING:
    import optuna
    import torch

    from adapters.base import Report

Objective = Callable[..., float]


def objective_ref(objective: Objective) -> str:
    """`module:qualname` of a function trial processes can import, or a ValueError saying why not."""
    module = getattr(objective, "__module__", None)
    qualname = getattr(objective, "__qualname__", "")
    if not callable(objective) or module is None or not qualname:
        raise ValueError(f"{objective!r} is not a function: pass objective(trial, device)")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(
            f"the objective {qualname!r} is defined inside a function or is a lambda: trial "
            "processes import it by name, so define it at the top level of a module"
        )
    return f"{module}:{qualname}"


def load_objective(ref: str) -> Objective:
    module_name, _, qualname = ref.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"{ref} is not a function")
    return found


class ObjectiveAdapter(BaseAdapter):
    """Runs `objective(trial, device)`; its memory model and batch range come from the options."""

    options = {"overhead_mb": 0.0, "per_sample_mb": 0.0, "batch_size_min": 0, "batch_size_max": 0}

    def __init__(self, objective: Objective, *, name: str, direction: str, metric: str) -> None:
        self._objective = objective
        self.name = name
        self.direction = direction
        self.metric = metric
        self.workload_class = "supervised"
        self._trial: optuna.Trial | None = None  # the one trial this process runs now
        self._takes_device = takes_device(objective)

    def memory_model(self, options: Mapping[str, Any]) -> MemoryModel:
        return MemoryModel(float(options["overhead_mb"]), float(options["per_sample_mb"]))

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
        self._trial = trial
        low, high = int(options["batch_size_min"]), int(options["batch_size_max"])
        if high <= 0:
            return {}
        return {"batch_size": trial.suggest_int("batch_size", low, high, log=True)}

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
        checkpoint: Any = None,
    ) -> float:
        assert self._trial is not None, "suggest() comes first"
        trial, self._trial = self._trial, None

        extra = (checkpoint,) if takes_handle(self._objective) else ()
        try:
            if self._takes_device:
                value = self._objective(trial, device, *extra)
            else:
                value = self._objective(trial)
        except ValueError as error:
            raise _batch_size_mismatch(error, options) from None
        return objective_value(value)  # type: ignore[return-value]


def _positional(objective: Objective) -> list | None:
    """The objective's positional parameters; None for a builtin or C function."""
    try:
        parameters = list(inspect.signature(objective).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in parameters if p.kind in kinds or p.kind == p.VAR_POSITIONAL]


def takes_handle(objective: Objective) -> bool:
    """Whether the objective takes a third argument, the checkpoint handle: a third positional
    parameter named `checkpoint` or without a default (one with a default is the user's own)."""
    positional = [p for p in _positional(objective) or () if p.kind != p.VAR_POSITIONAL]
    if len(positional) < 3:
        return False
    third = positional[2]
    return third.name == "checkpoint" or third.default is inspect.Parameter.empty


def takes_device(objective: Objective) -> bool:
    """Whether the objective is `objective(trial, device)`; `objective(trial)`, as Optuna users
    write it, picks its own device (the trial process's is the one CUDA_VISIBLE_DEVICES left)."""
    positional = _positional(objective)
    if positional is None:  # a builtin or C function: assume the documented form
        return True
    spread = any(p.kind == p.VAR_POSITIONAL for p in positional)
    return spread or len(positional) >= 2


# What Optuna says when a parameter is drawn again from an incompatible distribution.
_INCOMPATIBLE = ("Cannot set different", "does not support dynamic value space")


def _batch_size_mismatch(error: ValueError, options: Mapping[str, Any]) -> ValueError:
    """The error to raise: Optuna's, or, when the objective drew the batch size (drawn before it
    ran, for admission) from another distribution, what the objective must call instead."""
    low, high = int(options["batch_size_min"]), int(options["batch_size_max"])
    if high <= 0 or not any(words in str(error) for words in _INCOMPATIBLE):
        return error
    return ValueError(
        f"the objective draws batch_size from another distribution than batch_sizes=({low}, "
        f"{high}), which drew it before the trial ran: call trial.suggest_int('batch_size', "
        f"{low}, {high}, log=True) or read trial.params['batch_size'], or pass the objective's "
        f"own bounds as batch_sizes (Optuna: {error})"
    )
