"""Samplers: a particle swarm shared by every worker through the storage, and Optuna's own.

    from samplers import PSOSampler, bounded, make_sampler

Names are imported on first use, so importing this package does not import Optuna.
"""

from __future__ import annotations

# Marks this package as gpu-study-orchestrator's (see orchestrator.own_packages).
__gpu_study_orchestrator__ = True


from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from samplers._bounded import BoundedSampler, bounded
    from samplers._factory import SAMPLER_NAMES, make_sampler
    from samplers._lhs import latin_hypercube
    from samplers._pso import PSOSampler

_WHERE = {
    "PSOSampler": "samplers._pso",
    "BoundedSampler": "samplers._bounded",
    "bounded": "samplers._bounded",
    "make_sampler": "samplers._factory",
    "SAMPLER_NAMES": "samplers._factory",
    "latin_hypercube": "samplers._lhs",
}

__all__ = [
    "SAMPLER_NAMES",
    "BoundedSampler",
    "PSOSampler",
    "bounded",
    "latin_hypercube",
    "make_sampler",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'samplers' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
