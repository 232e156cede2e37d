"""A host's plan, assembled in one place for `run`, `worker`, `plan` and `orchestrator.plan`: the
GPUs `--gpus` names, and the planner's plan for each with its memory model (declared, or the one
calibrated or learnt on that kind of GPU and stored with the study's storage)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN
from orchestrator.gpu import select_devices
from orchestrator.planning import cpu_cores as cores
from orchestrator.planning.memory import DECLARED, measured_models
from orchestrator.planning.planner import plan_node

if TYPE_CHECKING:
    from adapters.base import MemoryModel
    from orchestrator.gpu.base import Device
    from orchestrator.planning.planner import NodePlan
    from orchestrator.record.store.location import StorageLocation


@dataclass(frozen=True)
class HostPlan:
    """This host's devices (and the probe that watches them) and their plans for one adapter."""

    probe: Any
    devices: list[Any]
    plan: NodePlan
    cpu_bound: bool


def host_plan(
    gpus: str,
    declared: MemoryModel,
    *,
    cpu_bound: bool,
    swarm_size: int,
    concurrency: int | None = None,
    budget_trials: int | None = None,
    cpu_cores: int | None = None,
    batch_bounds: tuple[int, int] = (BATCH_SIZE_MIN, BATCH_SIZE_MAX),
    stored_models: tuple[StorageLocation, str] | None = None,
    sim_dir: str | None = None,
    before_planning: Callable[[list[Device]], None] | None = None,
) -> HostPlan:
    """Plan the GPUs `gpus` names for trials of the `declared` memory model.

    `stored_models` (storage location, adapter name): where to look for memory models measured on
    these kinds of GPU, which replace `declared` on them; `cpu_cores` defaults to this machine's
    usable cores; simulated GPUs keep their files in `sim_dir`; `before_planning` is called with
    the devices before the stored models are read (`plan --calibrate` measures and stores them
    there, so the plan uses what it just measured)."""
    probe, devices = select_devices(gpus, sim_dir=sim_dir)
    if before_planning is not None:
        before_planning(devices)
    measured = None
    if stored_models is not None:
        location, adapter_name = stored_models
        measured = measured_models(location, adapter_name, declared, [d.name for d in devices])
    plan = plan_node(
        devices,
        declared,
        cpu_bound=cpu_bound,
        cpu_cores=cpu_cores or cores.usable_cpu_cores(),
        swarm_size=swarm_size,
        min_batch=batch_bounds[0],
        max_batch=batch_bounds[1],
        memory_model_source=DECLARED,
        concurrency=concurrency,
        budget_trials=budget_trials,
        gpu_memory_models=measured,
    )
    return HostPlan(probe, devices, plan, cpu_bound)
