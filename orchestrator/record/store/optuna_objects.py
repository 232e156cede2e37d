"""Optuna's own sampler and pruner objects, carried to every trial process.

`orchestrator.optimize(..., sampler=optuna.samplers.TPESampler(seed=1))` hands over an object;
the trials run in other processes (and on other nodes), which rebuild it from the study. The
object is pickled with the study's settings and unpickled once in each trial process, so it
keeps every argument the user gave it (a `constraints_func` too, if it is a module-level
function). A seeded sampler would propose the same points in every process, so each process
reseeds its copy's random generator once (Optuna's `reseed_rng`), as Optuna's own
`n_jobs` advice is to give each worker its own generator; `orchestrator.run.trial.stored_samplers`
makes that copy.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any


def pickled(obj: Any, what: str) -> str:
    """`obj` as text to store, or a ValueError saying why it cannot travel to trial processes."""
    try:
        data = pickle.dumps(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ValueError(
            f"the {what} {type(obj).__name__} cannot be pickled for the trial processes "
            f"({error}): give its functions at the top level of a module, or name the {what}"
        ) from None
    return base64.b64encode(data).decode("ascii")


def unpickled(text: str) -> Any:
    # Only what `optimize` stored with the study is read here: the study is trusted as code is.
    return pickle.loads(base64.b64decode(text.encode("ascii")))


def sampler_label(sampler: Any) -> str:
    """What the study's settings call a sampler object: its class (TPESampler)."""
    return type(sampler).__name__
