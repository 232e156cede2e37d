"""Samplers: a particle swarm and population-based training, each shared by every worker
through the storage, and Optuna's own.

    from samplers import PBTSampler, PSOSampler, SAMPLER_NAMES, bounded, make_sampler, sampler_kind
    from samplers import recommend  # a study's best configuration by a model of its trials

Names are imported on first use, so importing this package does not import Optuna.
"""

from __future__ import annotations

# Marks this package as gpu-study-orchestrator's (see orchestrator.imports).
__gpu_study_orchestrator__ = True


import importlib
from typing import Any

# Each public name, once: the module it is imported from on first use.
_WHERE = {
    "PSOSampler": "samplers._pso",
    "PBTSampler": "samplers._pbt",
    "BoundedSampler": "samplers._bounded",
    "bounded": "samplers._bounded",
    "make_sampler": "samplers._factory",
    "SAMPLER_NAMES": "samplers._factory",  # what `run --sampler` accepts
    "SamplerKind": "samplers._factory",
    "sampler_kind": "samplers._factory",  # a sampler's declaration: its rules, read by name
    "latin_hypercube": "samplers._lhs",
    # What a study recommends: its best configuration by a model, not its luckiest draw.
    "recommend": "samplers._model.recommend",
    "recommend_front": "samplers._model.recommend",
    "recommendation": "samplers._model.recommend",
    "ranked": "samplers._model.recommend",
    "Recommendation": "samplers._model.recommend",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'samplers' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
