"""`tft`: tune the temporal-fusion-style forecaster of the next returns (the GPU-bound workload).

The network is `adapters.forecaster`'s, the data `adapters.return_windows`'s; this module holds
the adapter: its options and search space, the checks made before a study is stored, and the
training loop. The validation loss (MSE of the standardised returns) is reported after every
epoch, so a pruner stops poor trials early, and the best epoch's value is the result.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from adapters import _tft_checkpoint, trial_log
from adapters.base import (
    BATCH_SIZE_MAX,
    BATCH_SIZE_MIN,
    SEED_MAX,
    BaseAdapter,
    Checkpoint,
    InputFile,
    Member,
    MemoryModel,
    Range,
    Report,
)
from adapters.forecaster import build_forecaster, forecaster_memory_model
from adapters.return_windows import (
    ShuffledStream,
    load_close_prices,
    split_windows,
    standardised_returns,
    steps_per_epoch,
    windows_fit,
)
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import optuna
    import torch
else:
    torch = LazyImport("torch")

WIDTH_STEP = 16  # a multiple of forecaster.HEADS: every width splits into the heads
WINDOW_STEP = 8
MIN_WIDTH = 16
MIN_WINDOW = 16


class SupervisedForecasterAdapter(BaseAdapter):
    name = "tft"
    workload_class = "supervised"
    direction = "minimize"
    metric = "val_loss"
    description = (
        "temporal-fusion-style transformer forecasting the next returns of the price series "
        "(GPU-bound)"
    )
    options = {
        "data": "",  # CSV with a `close` column; empty = the seeded synthetic series
        "steps": 1500,  # length of the synthetic series (raise it on a GPU)
        "seed": 0,  # synthetic series and weight initialisation
        "horizon": 4,  # how many next returns to predict
        "max_width": 64,  # search-space maxima: they size the memory model
        "max_window": 64,
        "max_depth": 2,
    }
    option_ranges = {
        "data": InputFile(),
        "steps": Range(100),
        "seed": Range(0, SEED_MAX),
        "horizon": Range(1),
        "max_width": Range(MIN_WIDTH),
        "max_window": Range(MIN_WINDOW),
        "max_depth": Range(1),
    }
    default_params = {
        "learning_rate": 1e-3,
        "batch_size": 256,
        "width": 64,
        "depth": 1,
        "dropout": 0.1,
        "window": 32,
        "weight_decay": 1e-4,
    }
    # Sized so `python -m orchestrator run tft` finishes in a few minutes on a laptop CPU.
    default_trials = 6

    def __init__(self) -> None:
        model = self.memory_model(self.options)
        self.model_overhead_mb = model.model_overhead_mb
        self.per_sample_mb = model.per_sample_mb

    def memory_model(self, options: Mapping[str, Any]) -> MemoryModel:
        sizes = _sizes(options)
        return forecaster_memory_model(
            sizes["max_width"], sizes["max_window"], sizes["max_depth"], sizes["horizon"]
        )

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Bad sizes, a bad price file or too short a series fail before the study is created,
        not in every trial: the prices are loaded as the trials load them, and the largest
        window of the search space must leave windows to train on and a held-out part."""
        sizes = _sizes(options)
        data = str(options.get("data", ""))
        prices = load_close_prices(data, sizes["steps"], int(options.get("seed", 0)))
        window, horizon, length = largest_window(sizes["max_window"]), sizes["horizon"], len(prices)
        if windows_fit(length - 1, window, horizon):
            return
        source = f"price file {data}" if data else f"the synthetic series (steps={length})"
        windows = range(MIN_WINDOW, window + 1, WINDOW_STEP)
        fits = [w for w in windows if windows_fit(length - 1, w, horizon)]
        fix = f"--option max_window={fits[-1]} or " if fits else ""
        longer = "a longer --data file" if data else "--option steps=4000"
        raise UserError(
            f"{source} has {length} prices: too short for window {window} + horizon {horizon} "
            f"with a held-out fifth; give {fix}{longer}"
        )

    def calibration_params(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters of the largest model the search space allows, batch_size aside: what
        `plan --calibrate` measures, so that the measured memory bounds every trial."""
        sizes = _sizes(options)
        return {
            **self.default_params,
            "width": sizes["max_width"],  # a multiple of WIDTH_STEP from MIN_WIDTH: reachable
            "window": largest_window(sizes["max_window"]),
            "depth": sizes["max_depth"],
        }

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
        sizes = _sizes(options)
        return {
            "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
            "width": trial.suggest_int("width", MIN_WIDTH, sizes["max_width"], step=WIDTH_STEP),
            "depth": trial.suggest_int("depth", 1, sizes["max_depth"]),
            "dropout": trial.suggest_float("dropout", 0.0, 0.3),
            "window": trial.suggest_int(
                "window", MIN_WINDOW, sizes["max_window"], step=WINDOW_STEP
            ),
            "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        }

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
        checkpoint: Checkpoint | None = None,
    ) -> float:
        started = time.perf_counter()
        sizes = _sizes(options)
        full = {**self.default_params, **params}
        batch_size = int(full["batch_size"])  # exactly as proposed: the plan bounds it, not us
        window, horizon = int(full["window"]), sizes["horizon"]
        seed = int(options.get("seed", 0))

        returns = standardised_returns(
            load_close_prices(str(options.get("data", "")), sizes["steps"], seed)
        )
        train_starts, val_starts = split_windows(len(returns), window, horizon)
        series = torch.as_tensor(returns, dtype=torch.float32, device=device)
        offsets = torch.arange(window + horizon, device=device)

        torch.manual_seed(seed)
        model = build_forecaster(
            int(full["width"]), window, int(full["depth"]), horizon, float(full["dropout"])
        ).to(device)
        step = _TrainingStep(model, full, device)

        def batch(starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rows = series[starts.unsqueeze(1) + offsets]
            return rows[:, :window], rows[:, window:]

        stream = ShuffledStream(len(train_starts), seed)
        train_starts = torch.as_tensor(train_starts, device=device)
        val_starts = torch.as_tensor(val_starts, device=device)
        steps = steps_per_epoch(len(train_starts), batch_size)
        best, best_epoch, start = _tft_checkpoint.resume(checkpoint, model, step, stream)
        for epoch in range(start, max(1, epochs)):
            model.train()
            for _ in range(steps):
                step(*batch(train_starts[stream.take(batch_size).to(device)]))
            value = _evaluate(model, val_starts, batch, batch_size, step.autocast)
            seconds = time.perf_counter() - started
            done = f"{(epoch + 1) * steps:,} gradient steps of {batch_size}"
            trial_log.write(trial_log.evaluation_line(epoch, self.metric, value, seconds, done))
            if not math.isfinite(value):
                trial_log.write(trial_log.value_line(self.metric, math.inf, seconds, "diverged"))
                return math.inf  # diverged: the worst possible result, not a crash
            if value < best:
                best, best_epoch = value, epoch
            report(epoch, value)
            _tft_checkpoint.save(checkpoint, epoch, model, step, stream, (best, best_epoch))
        how = f"the best epoch's score, step {best_epoch}"
        trial_log.write(trial_log.value_line(self.metric, best, time.perf_counter() - started, how))
        return best

    def train_fused(
        self,
        members: Sequence[Member],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
    ) -> list[float | BaseException]:
        """Trials of one `fuse_key` trained as one fused group (adapters/_tft_fused.py)."""
        from adapters import _tft_fused

        forecasting = _tft_fused.Forecasting(_TrainingStep, _sizes)
        return _tft_fused.train_fused(
            self, forecasting, members, epochs=epochs, device=device, options=options
        )

    # On a CPU a fused group measured 1.0x to 0.4x of its trials one after another (the
    # batched products cost more than the separate ones: docs/fused_tft.md); a GPU is where
    # fusing pays, unmeasured here.
    fusing_pays_on = ("cuda",)

    def fuse_key(self, params: Mapping[str, Any]) -> Hashable:
        """Which trials may share a fused group: width, depth, window and batch size. It reads
        only those parameters (a fused group's other members are asked with the ones it reads
        fixed: orchestrator/run/trial/group.py)."""
        from adapters import _tft_fused

        return _tft_fused.fuse_key(params, self.default_params)


class _TrainingStep:
    """One gradient step of AdamW on a batch, in mixed precision only where it pays: on CUDA,
    bf16 where supported (no loss scaling needed), else fp16 with a gradient scaler. On the CPU
    it is slower, so fp32."""

    def __init__(self, model: torch.nn.Module, params: Mapping[str, Any], device: torch.device):
        self.model = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=float(params["learning_rate"]),
            weight_decay=float(params["weight_decay"]),
        )
        self.amp_dtype = None
        if device.type == "cuda":
            self.amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)

    def autocast(self) -> AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self.amp_dtype)

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        with self.autocast():
            loss = torch.nn.functional.mse_loss(self.model(inputs).float(), targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()


def _evaluate(
    model: torch.nn.Module,
    starts: torch.Tensor,
    batch: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> float:
    """Mean squared error over every held-out window."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for begin in range(0, len(starts), batch_size):
            inputs, targets = batch(starts[begin : begin + batch_size])
            with autocast():
                predictions = model(inputs).float()
            total += torch.nn.functional.mse_loss(predictions, targets, reduction="sum").item()
            count += targets.numel()
    return total / max(1, count)


def largest_window(max_window: int) -> int:
    """The largest window `suggest` can draw: windows step by WINDOW_STEP from MIN_WINDOW."""
    return MIN_WINDOW + (max_window - MIN_WINDOW) // WINDOW_STEP * WINDOW_STEP


def _sizes(options: Mapping[str, Any]) -> dict[str, int]:
    """The integer options, checked: bad ones are a UserError naming the fix."""
    defaults = SupervisedForecasterAdapter.options
    sizes = {
        key: int(options.get(key, defaults[key]))
        for key in ("steps", "horizon", "max_width", "max_window", "max_depth")
    }
    if sizes["max_width"] < MIN_WIDTH or sizes["max_width"] % WIDTH_STEP:
        raise UserError(
            f"option max_width={sizes['max_width']}: use a multiple of {WIDTH_STEP}, e.g. 128"
        )
    if sizes["max_window"] < MIN_WINDOW:
        raise UserError(f"option max_window={sizes['max_window']}: use {MIN_WINDOW} or more")
    if sizes["max_depth"] < 1 or sizes["horizon"] < 1:
        raise UserError("options max_depth and horizon must be 1 or more")
    if sizes["steps"] < 100:
        raise UserError(f"option steps={sizes['steps']}: use 100 or more, e.g. 4000")
    return sizes


adapter = SupervisedForecasterAdapter()
