"""A temporal-fusion-style forecaster of the next returns: the GPU-bound supervised workload.

The model reads a window of a price series' log returns and predicts the next `horizon`
returns. It keeps the Temporal Fusion Transformer's building blocks - gated residual networks
(ELU MLP, GLU gate, residual, LayerNorm), gated skip connections around causal multi-head
self-attention - without the covariate machinery (variable selection, static encoders): it has
one input, the series itself. The prices are the trading environment's (synthetic by default,
`--data prices.csv` with a `close` column otherwise). The first part of the series trains, the
later part is held out; the validation loss (MSE of the standardised returns) is reported after
every epoch, so a pruner stops poor trials early, and the best epoch's value is the result.

Every batch is GPU work (no environment to simulate), so its cost grows with batch size, width,
window and depth: the memory model below says how, and tests/test_supervised.py checks it
against a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from adapters.base import (
    BATCH_SIZE_MAX,
    BATCH_SIZE_MIN,
    SEED_MAX,
    BaseAdapter,
    InputFile,
    MemoryModel,
    Range,
    Report,
)

if TYPE_CHECKING:
    import numpy as np
    import optuna
    import torch

HEADS = 4  # attention heads; every width in the search space is a multiple of this
WIDTH_STEP = 16
WINDOW_STEP = 8
MIN_WIDTH = 16
MIN_WINDOW = 16
VALIDATION_FRACTION = 0.2  # the later fifth of the series is held out

# --- Memory model -------------------------------------------------------------------------
#
# Per sample, training keeps every tensor that backward needs until backward has used it. In
# fp32 elements, for window W, width d and h heads, what one sample leaves saved is:
#
#   gated residual network (GRN): fc1 input, ELU input, ELU output (= fc2 input), dropout mask,
#     GLU projection input, GLU input (2 W d), LayerNorm input                     8 W d
#   attention sublayer: qkv projection input, q, k, v, attention output (= output projection
#     input), GLU projection input, GLU input (2 W d), LayerNorm input              9 W d
#     plus, on the unfused (math) path: softmax output, dropout mask, dropped weights  3 h W^2
#   every LayerNorm: mean and 1/std per position                                      2 W
#   one block = attention sublayer + GRN; the model = value projection input (W), the encoder
#   GRN, `depth` blocks, and the head's input: the last position of the last block's output,
#   a view that keeps the whole W d output alive.
#
# This is the CPU's layout, counted exactly (tests/test_supervised.py measures it): an upper
# bound for a GPU, where dropout masks are one byte, fused attention kernels keep none of the
# W^2 tensors and autocast stores many activations in 16 bits.
# On top of what is saved, backward briefly holds the gradients of one block's activations,
# and the caching allocator rounds blocks up: TRANSIENT_FACTOR covers both.
GRN_SAVED_PER_WD = 8
ATTENTION_SAVED_PER_WD = 9
ATTENTION_SAVED_PER_HW2 = 3
LAYERNORM_SAVED_PER_W = 2
TRANSIENT_FACTOR = 1.25
BYTES_FP32 = 4
MB = 1024 * 1024

# Fixed per trial: the CUDA context with its kernels and cuBLAS/cuDNN workspaces (about
# 300-500 MB on current GPUs, held outside PyTorch's allocator, so torch's own counters never
# show it), plus parameters, their gradients and Adam's two moments (4 copies of the largest
# model in the search space), plus the validation batch's outputs and the series on the device.
CUDA_CONTEXT_MB = 500.0
STATE_COPIES = 4  # parameters + gradients + Adam exp_avg + exp_avg_sq


def block_parameters(width: int) -> int:
    """Parameters of one fusion block (attention sublayer + GRN), weights and biases."""
    d = width
    attention = (d * 3 * d + 3 * d) + (d * d + d)  # qkv + output projection
    attention_gate = d * 2 * d + 2 * d + 2 * d  # GLU projection + LayerNorm
    return attention + attention_gate + grn_parameters(width)


def grn_parameters(width: int) -> int:
    d = width
    return (d * d + d) * 2 + (d * 2 * d + 2 * d) + 2 * d  # fc1, fc2, GLU projection, LayerNorm


def model_parameters(width: int, window: int, depth: int, horizon: int) -> int:
    """Every parameter of `Forecaster(width, window, depth, horizon)`."""
    embedding = (1 * width + width) + window * width  # value projection + position embedding
    head = width * horizon + horizon
    return embedding + grn_parameters(width) + depth * block_parameters(width) + head


def activation_bytes_per_sample(width: int, window: int, depth: int) -> float:
    """What training saves for backward per sample, in bytes (fp32, unfused attention)."""
    w, wd = window, window * width
    grn = GRN_SAVED_PER_WD * wd + LAYERNORM_SAVED_PER_W * w
    attention = ATTENTION_SAVED_PER_WD * wd + ATTENTION_SAVED_PER_HW2 * HEADS * w * w
    attention += LAYERNORM_SAVED_PER_W * w
    elements = w + grn + depth * (attention + grn) + wd
    return float(elements * BYTES_FP32)


def forecaster_memory_model(
    max_width: int, max_window: int, max_depth: int, horizon: int
) -> MemoryModel:
    """The memory model at the largest width, window and depth that the search space allows."""
    params = model_parameters(max_width, max_window, max_depth, horizon)
    state_mb = STATE_COPIES * params * BYTES_FP32 / MB
    per_sample_mb = (
        TRANSIENT_FACTOR * activation_bytes_per_sample(max_width, max_window, max_depth) / MB
    )
    return MemoryModel(model_overhead_mb=CUDA_CONTEXT_MB + state_mb, per_sample_mb=per_sample_mb)


# --- Price data --------------------------------------------------------------------------


def load_close_prices(data: str, steps: int, seed: int) -> np.ndarray:
    """The trading environment's prices: the `close` column of the CSV at `data`, else its
    seeded regime-switching synthetic series of `steps` prices (see adapters/envs/prices.py)."""
    from adapters.envs.prices import load_prices, synthetic_prices

    if data:
        return load_prices(data)
    return synthetic_prices(steps, seed=seed)


# --- The model ---------------------------------------------------------------------------


def _modules() -> type[torch.nn.Module]:
    """The forecaster's class, defined here so that torch is imported only when a model is built."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class GatedResidualNetwork(nn.Module):
        """TFT's GRN: ELU MLP, dropout, GLU gate, residual, LayerNorm."""

        def __init__(self, width: int, dropout: float) -> None:
            super().__init__()
            self.fc1 = nn.Linear(width, width)
            self.fc2 = nn.Linear(width, width)
            self.dropout = nn.Dropout(dropout)
            self.gate = nn.Linear(width, 2 * width)
            self.norm = nn.LayerNorm(width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden = self.dropout(self.fc2(F.elu(self.fc1(x))))
            return self.norm(x + F.glu(self.gate(hidden)))

    class FusionBlock(nn.Module):
        """Causal self-attention with a gated skip connection, then a GRN."""

        def __init__(self, width: int, dropout: float) -> None:
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.out = nn.Linear(width, width)
            self.gate = nn.Linear(width, 2 * width)
            self.norm = nn.LayerNorm(width)
            self.grn = GatedResidualNetwork(width, dropout)
            self.dropout = dropout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, window, width = x.shape
            q, k, v = self.qkv(x).view(batch, window, 3, HEADS, width // HEADS).unbind(2)
            attended = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=True,
            )
            attended = self.out(attended.transpose(1, 2).reshape(batch, window, width))
            return self.grn(self.norm(x + F.glu(self.gate(attended))))

    class Forecaster(nn.Module):
        """Window of returns -> the next `horizon` returns."""

        def __init__(
            self, width: int, window: int, depth: int, horizon: int, dropout: float
        ) -> None:
            super().__init__()
            self.value = nn.Linear(1, width)
            self.position = nn.Parameter(torch.randn(window, width) * 0.02)
            self.encoder = GatedResidualNetwork(width, dropout)
            self.blocks = nn.ModuleList(FusionBlock(width, dropout) for _ in range(depth))
            self.head = nn.Linear(width, horizon)

        def forward(self, returns: torch.Tensor) -> torch.Tensor:
            x = self.encoder(self.value(returns.unsqueeze(-1)) + self.position)
            for block in self.blocks:
                x = block(x)
            return self.head(x[:, -1])  # the last step has seen the whole window

    return Forecaster


def build_forecaster(
    width: int, window: int, depth: int, horizon: int, dropout: float = 0.0
) -> torch.nn.Module:
    """The forecaster for these sizes (public so tests and users can measure it)."""
    return _modules()(width, window, depth, horizon, dropout)


# --- The adapter -------------------------------------------------------------------------


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
        from orchestrator.errors import UserError

        sizes = _sizes(options)
        data = str(options.get("data", ""))
        prices = load_close_prices(data, sizes["steps"], int(options.get("seed", 0)))
        window, horizon, length = largest_window(sizes["max_window"]), sizes["horizon"], len(prices)
        if _windows_fit(length - 1, window, horizon):
            return
        source = f"price file {data}" if data else f"the synthetic series (steps={length})"
        windows = range(MIN_WINDOW, window + 1, WINDOW_STEP)
        fits = [w for w in windows if _windows_fit(length - 1, w, horizon)]
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
    ) -> float:
        import contextlib

        import torch

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
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=float(full["learning_rate"]),
            weight_decay=float(full["weight_decay"]),
        )

        # Mixed precision only where it pays: on CUDA, bf16 where supported (no loss scaling
        # needed), else fp16 with a gradient scaler. On the CPU it is slower, so fp32.
        on_cuda = device.type == "cuda"
        amp_dtype = None
        if on_cuda:
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)

        def autocast() -> contextlib.AbstractContextManager[Any]:
            if amp_dtype is None:
                return contextlib.nullcontext()
            return torch.autocast("cuda", dtype=amp_dtype)

        def batch(starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rows = series[starts.unsqueeze(1) + offsets]
            return rows[:, :window], rows[:, window:]

        stream = _ShuffledStream(len(train_starts), seed)
        train_starts = torch.as_tensor(train_starts, device=device)
        val_starts = torch.as_tensor(val_starts, device=device)
        best = math.inf
        for epoch in range(max(1, epochs)):
            model.train()
            for _ in range(steps_per_epoch(len(train_starts), batch_size)):
                inputs, targets = batch(train_starts[stream.take(batch_size).to(device)])
                with autocast():
                    loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            value = _evaluate(model, val_starts, batch, batch_size, autocast)
            if not math.isfinite(value):
                return math.inf  # diverged: the worst possible result, not a crash
            best = min(best, value)
            report(epoch, value)
        return best


def steps_per_epoch(windows: int, batch_size: int) -> int:
    """Gradient steps in one epoch: the fewest full batches that see every training window.

    Every step uses exactly `batch_size` windows, as the planner assumed when it sized the
    trial's memory, so a batch larger than the series repeats windows within the step. An epoch
    is then about one pass over the data (one step when the batch holds them all): comparable
    work for every batch size, and the pruner compares trials at comparable points.
    """
    return max(1, math.ceil(windows / batch_size))


class _ShuffledStream:
    """Window indices from one shuffle after another, wrapping around: batches take the next
    `n`, crossing from one shuffle into the next (and epochs with it), so no batch is short
    and every window is used equally often."""

    def __init__(self, windows: int, seed: int) -> None:
        import torch

        self.windows = windows
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.pending = torch.empty(0, dtype=torch.long)

    def take(self, n: int) -> torch.Tensor:
        import torch

        if len(self.pending) < n:
            shuffles = -(-(n - len(self.pending)) // self.windows)
            fresh = [
                torch.randperm(self.windows, generator=self.generator) for _ in range(shuffles)
            ]
            self.pending = torch.cat([self.pending, *fresh])
        taken, self.pending = self.pending[:n], self.pending[n:]
        return taken


def _evaluate(
    model: torch.nn.Module,
    starts: torch.Tensor,
    batch: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> float:
    """Mean squared error over every held-out window."""
    import torch

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


def standardised_returns(prices: np.ndarray) -> np.ndarray:
    """Log returns scaled by the training part's standard deviation (no peeking ahead)."""
    import numpy as np

    returns = np.diff(np.log(prices))
    train_end = int(len(returns) * (1.0 - VALIDATION_FRACTION))
    train = returns[:train_end]
    scale = float(train.std()) or 1.0
    return ((returns - float(train.mean())) / scale).astype(np.float32)


def largest_window(max_window: int) -> int:
    """The largest window `suggest` can draw: windows step by WINDOW_STEP from MIN_WINDOW."""
    return MIN_WINDOW + (max_window - MIN_WINDOW) // WINDOW_STEP * WINDOW_STEP


def _windows_fit(length: int, window: int, horizon: int) -> bool:
    """Whether `length` returns give a training window and a held-out one (see split_windows)."""
    from orchestrator.errors import UserError

    try:
        split_windows(length, window, horizon)
    except UserError:
        return False
    return True


def split_windows(length: int, window: int, horizon: int) -> tuple[list[int], list[int]]:
    """Window start indices: training targets lie before the split, validation inputs after it."""
    from orchestrator.errors import UserError

    span = window + horizon
    split = int(length * (1.0 - VALIDATION_FRACTION))
    train = list(range(0, split - span + 1))
    val = list(range(split, length - span + 1))
    if len(train) < 1 or len(val) < 1:
        raise UserError(
            f"the series has {length + 1} prices: too short for window {window} + horizon "
            f"{horizon}; give --option steps=4000 or a longer --data file"
        )
    return train, val


def _sizes(options: Mapping[str, Any]) -> dict[str, int]:
    """The integer options, checked: bad ones are a UserError naming the fix."""
    from orchestrator.errors import UserError

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
