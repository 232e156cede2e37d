"""The GPU check's own model: the `tft` forecaster, with a memory model too low on purpose.

`benchmarks/gpu_check.py` runs a real study of this adapter so that real CUDA out-of-memory errors
happen, and checks that the pool catches them, re-runs the trials and records what each used:

- `memory_model` is tft's declared model times `undersize` (default 0.02): the planner believes
  fifty times more fits than does, so it plans wide and lets every trial's batch size reach the
  top of the search space (4096), where they cannot fit.
- Width, window and depth stay at the options' maxima, the model `plan --calibrate` measures, so a
  trial's memory depends on its batch size alone and the calibration says which batches fit.
  The sampler searches learning rate, batch size, dropout and weight decay.
- `part_mb` (default 0: the whole GPU) is the part of the GPU a trial process may use: `train`
  calls `torch.cuda.set_per_process_memory_fraction` before it allocates anything, so a trial
  that needs more gets a real `torch.cuda.OutOfMemoryError` from CUDA's caching allocator.

    python -m orchestrator run --adapter-path benchmarks.gpu_check_adapter:adapter --gpus 0 \\
        --option part_mb=24576 --option max_width=512 --option max_window=256 --option max_depth=4
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, MemoryModel, Report
from adapters.tft import SupervisedForecasterAdapter, _sizes, largest_window

if TYPE_CHECKING:
    import optuna
    import torch

MIB = 1024 * 1024


def undersized(model: MemoryModel, factor: float) -> MemoryModel:
    """`model` with both terms scaled by `factor` (below 1: deliberately too low)."""
    return MemoryModel(model.model_overhead_mb * factor, model.per_sample_mb * factor)


def memory_fraction(part_mb: float, total_bytes: int) -> float | None:
    """The share of a GPU of `total_bytes` that `part_mb` is (None: no limit, use it all)."""
    if part_mb <= 0 or total_bytes <= 0:
        return None
    return min(1.0, part_mb * MIB / total_bytes)


class UndersizedForecaster(SupervisedForecasterAdapter):
    name = "tft-undersized"
    description = "tft at one fixed model size with a memory model too low on purpose (GPU check)"
    options = {**SupervisedForecasterAdapter.options, "undersize": 0.02, "part_mb": 0.0}
    default_trials = 24

    def memory_model(self, options: Mapping[str, Any]) -> MemoryModel:
        factor = float(options.get("undersize", self.options["undersize"]))
        return undersized(super().memory_model(options), factor)

    def check_options(self, options: Mapping[str, Any]) -> None:
        from orchestrator.errors import UserError

        if not 0 < float(options.get("undersize", self.options["undersize"])) <= 1:
            raise UserError("option undersize must be more than 0 and at most 1, e.g. 0.02")
        if float(options.get("part_mb", 0.0)) < 0:
            raise UserError("option part_mb must be 0 (the whole GPU) or a number of MB")
        super().check_options(options)

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
        sizes = _sizes(options)
        return {
            "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
            "dropout": trial.suggest_float("dropout", 0.0, 0.3),
            "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
            "width": sizes["max_width"],
            "window": largest_window(sizes["max_window"]),
            "depth": sizes["max_depth"],
        }

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        if device.type == "cuda":
            import torch

            total = torch.cuda.get_device_properties(device).total_memory
            fraction = memory_fraction(float(options.get("part_mb", 0.0)), total)
            if fraction is not None:
                torch.cuda.set_per_process_memory_fraction(fraction, device)
        return super().train(params, epochs=epochs, device=device, options=options, report=report)


adapter = UndersizedForecaster()
