"""`plan ADAPTER`: how many trials of an adapter fit on each GPU, with which batch sizes, and why."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import adapters
from orchestrator.errors import UserError
from orchestrator.flags.common import (
    add_adapter_arguments,
    add_storage_argument,
    add_swarm_size_argument,
    command_parser,
    whole_number,
)
from orchestrator.host_options import add_concurrency_argument, add_gpus_argument
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import add_workloads_argument, workload_class
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import StudySpec

if TYPE_CHECKING:
    from adapters.base import MemoryModel
    from orchestrator.gpu.base import Device
    from orchestrator.planning import calibrate as calibration
    from orchestrator.planning import host_plan as host_plans
    from orchestrator.planning import memory
    from orchestrator.planning.planner import GpuPlan, NodePlan
    from orchestrator.record.store import migrate
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    migrate = LazyImport("orchestrator.record.store.migrate")
    calibration = LazyImport("orchestrator.planning.calibrate")
    host_plans = LazyImport("orchestrator.planning.host_plan")
    memory = LazyImport("orchestrator.planning.memory")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "plan",
        help="show how many trials fit on each GPU at once, with which batch sizes, and what limits them",
        example="python -m orchestrator plan dqn --gpus sim:24576,sim:49152",
    )
    parser.add_argument(
        "adapter", nargs="?", metavar="ADAPTER", help="adapter name (see `adapters`)"
    )
    add_adapter_arguments(parser)
    add_gpus_argument(parser)
    add_storage_argument(parser)
    add_swarm_size_argument(parser)
    add_concurrency_argument(parser)
    parser.add_argument(
        "--cpu-cores",
        type=whole_number("--cpu-cores", high=100_000, example=8),
        metavar="N",
        help="plan for a host with N usable CPU cores (default: this machine's, after affinity and cgroup quota)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the memory model on each kind of GPU first (two short trainings) and store it",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    add_workloads_argument(parser)
    parser.set_defaults(handler=plan_command, swarm_size=StudySpec.swarm_size)


def plan_command(args: argparse.Namespace) -> int:
    if args.swarm_size < 1:
        raise UserError(f"--swarm-size {args.swarm_size}: the swarm needs at least 1 particle")
    if args.concurrency is not None and args.concurrency < 1:
        raise UserError(f"--concurrency {args.concurrency}: give at least 1 trial per GPU")
    if args.cpu_cores is not None and args.cpu_cores < 1:
        raise UserError(f"--cpu-cores {args.cpu_cores}: a host has at least 1 CPU core")
    if args.adapter_path:
        ref = calibration.AdapterRef(path=args.adapter_path)
    elif args.adapter:
        ref = calibration.AdapterRef(name=args.adapter)
    else:
        raise UserError(
            "name an adapter, e.g. `plan dqn`, or load one with --adapter-path module:attribute"
        )
    adapter = ref.load()
    options = adapters.parse_options(adapter, args.option)
    declared = adapters.memory_model_of(adapter, options)
    workload = workload_class(adapter.workload_class, args.workloads)
    location = StorageLocation.resolve(args.storage)

    with tempfile.TemporaryDirectory(prefix="orchestrator-plan-") as sim_dir:
        plan = host_plans.host_plan(
            args.gpus,
            declared,
            cpu_bound=workload.cpu_bound,
            swarm_size=args.swarm_size,
            concurrency=args.concurrency,
            cpu_cores=args.cpu_cores,
            stored_models=(location, adapter.name),
            sim_dir=sim_dir,
            # --calibrate measures on the devices found and stores the models the plan then reads
            before_planning=(
                lambda devices: _calibrate(ref, adapter, options, devices, location, args)
            )
            if args.calibrate
            else None,
        ).plan
    if args.json:
        print(json.dumps(plan_json(plan, adapter, args), indent=2))
    else:
        print("\n".join(render_plan(plan, adapter, args)))
    return 0


def plan_json(plan: NodePlan, adapter: Any, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "adapter": adapter.name,
        "workload_class": adapter.workload_class,
        "gpus_spec": args.gpus,
        "swarm_size": args.swarm_size,
        "concurrency": args.concurrency,
        **plan.as_dict(),
    }


def describe_model(model: MemoryModel, source: str) -> str:
    return f"{source}: {model.model_overhead_mb:,.0f} MB + {model.per_sample_mb:g} MB per sample"


def render_plan(plan: NodePlan, adapter: Any, args: argparse.Namespace) -> list[str]:
    """The plan in words: one line without a GPU, else a header and a block per GPU."""
    first = plan.gpus[0]
    if first.device is None:
        found = "no GPU" if args.gpus == "none" else "no GPU found"
        low, high = first.batch_bounds
        at_once = (
            "1 trial at a time"
            if first.slots == 1
            else f"up to {first.slots} trials at once (one per CPU core)"
        )
        return [
            f"{found} (--gpus {args.gpus}): {adapter.name} runs {at_once} on the CPU, "
            f"batch sizes {low}..{high} (memory model {describe_model(first.memory_model, first.memory_model_source)})"
        ]
    cores = plan.cpu_cores
    bound = (
        f"{adapter.workload_class} is CPU-bound: at most {cores} trials at once over all GPUs "
        f"({cores} usable CPU cores)"
        if plan.cpu_bound
        else f"{adapter.workload_class} is GPU-bound: not capped by the {cores} CPU cores"
    )
    lines = [f"plan for {adapter.name}: swarm of {args.swarm_size}; {bound}"]
    for gpu in plan.gpus:
        lines.append("")
        lines.extend(_render_gpu(gpu, plan, args))
    lines.append("")
    count = len(plan.gpus)
    lines.append(
        f"in all: at most {_trials(plan.total_slots)} at once on {count} GPU{'s' if count > 1 else ''}"
    )
    return lines


def _trials(count: int) -> str:
    return f"{count} trial{'s' if count != 1 else ''}"


def _limit_words(gpu: GpuPlan, plan: NodePlan, args: argparse.Namespace) -> str:
    vram = gpu.strategy.max_concurrent_trials
    if gpu.limited_by == "vram":
        return "VRAM"
    if gpu.limited_by == "swarm":
        return f"swarm size {args.swarm_size} (VRAM fits more)"
    if gpu.limited_by == "cpu":
        shared = f", shared by {len(plan.gpus)} GPUs" if len(plan.gpus) > 1 else ""
        return f"CPU cores ({plan.cpu_cores} usable{shared}; VRAM fits {vram})"
    if gpu.limited_by == "user":
        return f"--concurrency {args.concurrency} (VRAM fits {vram})"
    if gpu.limited_by == "budget":
        return f"the study's budget (VRAM fits {vram})"
    return gpu.limited_by


def _render_gpu(gpu: GpuPlan, plan: NodePlan, args: argparse.Namespace) -> list[str]:
    device = gpu.device
    assert device is not None
    low, high = gpu.batch_bounds
    typical_batch = round((low * high) ** 0.5)
    sizes = [
        ("smallest", gpu.per_trial_mb, low),
        ("typical", gpu.typical_trial_mb, typical_batch),
        ("largest", gpu.largest_trial_mb, high),
    ]
    at_once = "; ".join(
        f"{name} {mb:,.0f} MB (batch {batch}): {gpu.trials_at_once(mb)}"
        for name, mb, batch in sizes
    )
    rows = [
        (f"GPU {device.index}", f"{device.name} ({device.kind})"),
        ("total VRAM", f"{gpu.total_mb:,.0f} MB ({gpu.usable_mb:,.0f} MB usable, 20% kept free)"),
        ("memory model", describe_model(gpu.memory_model, gpu.memory_model_source)),
        ("memory budget", f"{gpu.usable_mb:,.0f} MB; each trial admitted by its own footprint"),
        ("batch bounds", f"{low}..{high} (what fits this GPU alone)"),
        ("at once", at_once),
        ("at most", f"{_trials(gpu.slots)} at once, limited by {_limit_words(gpu, plan, args)}"),
    ]
    lines = [rows[0][0] + "  " + rows[0][1]] + [f"  {key:<13} {value}" for key, value in rows[1:]]
    if not gpu.fits:
        lines.append(
            f"  warning: one trial needs {gpu.per_trial_mb:,.0f} MB, more than the "
            f"{gpu.usable_mb:,.0f} MB usable: expect out-of-memory errors on this GPU"
        )
    return lines


def _calibrate(
    ref: Any,
    adapter: Any,
    options: dict[str, Any],
    devices: Sequence[Device],
    location: StorageLocation,
    args: argparse.Namespace,
) -> None:
    """Measure on the first GPU of each name and store the models, before planning with them."""
    real = [device for device in devices if device.kind == "cuda"]
    if not real:
        what = "simulated GPUs have no memory to measure" if devices else "none was found"
        raise UserError(
            f"--calibrate needs a real CUDA GPU but {what} (--gpus {args.gpus}); "
            "plan without --calibrate to use the declared memory model"
        )
    check_options = getattr(adapter, "check_options", None)
    if callable(check_options):
        check_options(options)  # bad data fails here, not inside the calibration process
    # Fails early, here, if it cannot vary batch_size.
    calibration.calibration_params(adapter, 1, options)
    first_by_name: dict[str, Device] = {}
    for device in real:
        first_by_name.setdefault(device.name, device)
    engine = migrate.open_storage(location).engine
    for name, device in first_by_name.items():
        result = calibration.calibrate(ref, options, device_index=device.index, gpu_name=name)
        memory.save_measured(
            engine,
            adapter=adapter.name,
            gpu_name=name,
            model=result.model,
            source=calibration.SOURCE,
            samples=len(result.measurements),
        )
        if not args.json:
            peaks = ", ".join(
                f"batch {m.batch_size}: {m.peak_reserved_mb:,.0f} MB" for m in result.measurements
            )
            print(f"calibrated {adapter.name} on {name} ({peaks}); stored in {location.masked}")
