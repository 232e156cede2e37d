"""Workload classes: what kind of hardware a model wants, and its defaults (seed 000).

RL training is CPU-bound (environment simulation) and small on the GPU; supervised models are
GPU-bound. The planner caps CPU-bound work at the host's cores; the deployment manifests route
each class to its node pool with its own CPU and memory. One table, read by both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    cpu_bound: bool  # concurrent trials on a host never exceed its usable cores
    default_epochs: int


WORKLOAD_CLASSES: dict[str, WorkloadClass] = {
    "rl": WorkloadClass(name="rl", cpu_bound=True, default_epochs=8),
    "supervised": WorkloadClass(name="supervised", cpu_bound=False, default_epochs=15),
}


def workload_class(name: str) -> WorkloadClass:
    try:
        return WORKLOAD_CLASSES[name]
    except KeyError:
        raise ValueError(
            f"unknown workload class {name!r}: use one of {', '.join(sorted(WORKLOAD_CLASSES))}"
        ) from None
