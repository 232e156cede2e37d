"""Measure an adapter's memory model on a real GPU: two short trainings, a line through their peaks.

Each measurement runs one epoch of the largest model the adapter's search space allows (its
`calibration_params(options)`, where it has that method; else its `default_params`), with only
`batch_size` changed, in a fresh spawned process, and reads `torch.cuda.max_memory_reserved()` there: the same
number a trial process records as `vram_peak_mb`, so calibration and trials measure one thing.
(The CUDA context of each process is outside that number; the planner's 20% margin covers it.)
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import adapters
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, MemoryModel, option_defaults
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.planning.memory import fit_memory_model

if TYPE_CHECKING:
    import torch
else:
    torch = LazyImport("torch")

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SOURCE = "calibration"


@dataclass(frozen=True)
class AdapterRef:
    """How a fresh process finds the adapter again: a registered name or a module:attribute path."""

    name: str | None = None
    path: str | None = None

    def load(self) -> Any:
        return adapters.resolve(self.path or self.name or "", is_path=bool(self.path))


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    peak_reserved_mb: float
    peak_allocated_mb: float


@dataclass(frozen=True)
class Calibration:
    gpu_name: str
    measurements: tuple[Measurement, ...]
    model: MemoryModel


def calibration_params(
    adapter: Any, batch_size: int, options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a calibration trains with `batch_size`: the largest model the search space allows.

    Trials go up to the search space's largest sizes, so a measurement of anything smaller
    underestimates them. An adapter says what its largest model is with an optional method
    `calibration_params(options) -> dict` ("the parameters of the largest model the search space
    allows, batch_size aside"); without one, its `default_params` are measured, and must have a
    batch_size to show that the adapter takes one. `options` default to the adapter's own.
    """
    method = getattr(adapter, "calibration_params", None)
    if callable(method):
        chosen = option_defaults(adapter) if options is None else options
        params = dict(method(chosen))
    else:
        params = dict(getattr(adapter, "default_params", {}) or {})
        if "batch_size" not in params:
            raise UserError(
                f"adapter {adapter.name!r} has no batch_size in its default_params: calibration "
                "varies the batch size, so add one (or plan with the declared memory model)"
            )
    params["batch_size"] = int(batch_size)
    return params


def calibration_epoch(
    adapter: Any, options: Mapping[str, Any], batch_size: int, device: torch.device
) -> None:
    """One epoch of the calibration model at `batch_size` on `device`, its value ignored."""
    adapter.train(
        calibration_params(adapter, batch_size, options),
        epochs=1,
        device=device,
        options=dict(options),
        report=lambda epoch, value: None,
    )


def measure_peak(
    ref: AdapterRef, options: Mapping[str, Any], batch_size: int, device_index: int
) -> Measurement:
    """One epoch at `batch_size` on cuda:`device_index`; the peaks torch's allocator saw (MB)."""
    torch.set_num_threads(1)
    adapter = ref.load()
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    torch.cuda.reset_peak_memory_stats(device)
    calibration_epoch(adapter, options, batch_size, device)
    torch.cuda.synchronize(device)
    return Measurement(
        batch_size=batch_size,
        peak_reserved_mb=torch.cuda.max_memory_reserved(device) / MIB,
        peak_allocated_mb=torch.cuda.max_memory_allocated(device) / MIB,
    )


def measure_in_fresh_process(
    ref: AdapterRef, options: Mapping[str, Any], batch_size: int, device_index: int
) -> Measurement:
    """`measure_peak` in a spawned process: nothing cached by an earlier run inflates the peak."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure_peak, ref, dict(options), batch_size, device_index).result()


def _is_oom(error: BaseException) -> bool:
    return "out of memory" in str(error).lower() or type(error).__name__.endswith(
        "OutOfMemoryError"
    )


def calibrate(
    ref: AdapterRef,
    options: Mapping[str, Any],
    *,
    device_index: int,
    gpu_name: str,
    batch_sizes: Sequence[int] = (BATCH_SIZE_MIN, BATCH_SIZE_MAX),
    measure: Callable[
        [AdapterRef, Mapping[str, Any], int, int], Measurement
    ] = measure_in_fresh_process,
) -> Calibration:
    """Measure at each batch size (the largest halves on an out-of-memory error) and fit the line."""
    sizes = sorted({int(size) for size in batch_sizes})
    if len(sizes) < 2:
        raise ValueError("calibration needs two different batch sizes")
    measurements = [measure(ref, options, sizes[0], device_index)]
    for size in sizes[1:]:
        while True:
            try:
                measurements.append(measure(ref, options, size, device_index))
                break
            except Exception as error:
                if not _is_oom(error) or size // 2 <= sizes[0]:
                    raise
                log.info("batch %d ran out of memory on %s; trying %d", size, gpu_name, size // 2)
                size //= 2
    model = fit_memory_model((m.batch_size, m.peak_reserved_mb) for m in measurements)
    return Calibration(gpu_name, tuple(measurements), model)
