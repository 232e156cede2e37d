"""Forecaster (`tft`) trials trained as one fused group: the `tft` adapter's `train_fused` and
`fuse_key` (docs/fused.md has the contract, docs/fused_tft.md this adapter's design and figures).

The forecaster's layers are written for one model, so the group does not rewrite them: each
member builds its own model and `_TrainingStep` exactly as `tft.train` does (its seed's first
weights, its AdamW with its learning rate and weight decay, its gradient scaler), then the
members' parameters are stacked (`[N, ...]` per parameter) and every member's model is pointed
at its row, so its own optimiser, clip and checkpoint work on its row in place. A gradient step
is one `torch.func.vmap` of `functional_call` over the stack (one forward), one backward of the
sum of the members' losses (members share no weight, so row i's gradient is member i's own),
then each member's own unscale, clip (norm 1.0, its own norm) and AdamW step, as alone.

What each member keeps as its own: its first weights, its window stream (its generator, so its
batches are the ones it draws alone), its dropout rate (below), its optimiser and scaler state,
its reports, its best epoch and its checkpoints, in `_tft_checkpoint`'s format (a member saved
in a group goes on alone with `train`, and a trial's checkpoint goes on in a group). Resumed
members may stand at different epochs: each trains its own next epoch every round and leaves
after its last.

Dropout: members of one group may have different rates. Where they all have the same rate the
forward is the layers' own. Otherwise the group's copy of the network takes each rate as a
per-member value (`_RateDropout`, and attention weights dropped after a softmax written out,
as `scaled_dot_product_attention` does inside). Either way the masks are drawn from the
process's generator under `vmap(randomness="different")`: each member gets masks of its own,
not the masks it draws alone (those come from the same generator in another order).

A member whose `report` raises (optuna.TrialPruned, a checkpoint's TrainedUntil) or whose
checkpoint fails leaves the group at that epoch: the stack is rebuilt from the others' rows and
they go on. An error of the fused step or evaluation ends every member still in the group. A
group of one is `train` itself.

This module imports torch as it loads: `tft` imports it only when a group trains.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adapters import _tft_checkpoint, trial_log
from adapters._forecaster_layers import FusionBlock
from adapters.base import Member, train_alone
from adapters.forecaster import build_forecaster
from adapters.return_windows import (
    ShuffledStream,
    load_close_prices,
    split_windows,
    standardised_returns,
    steps_per_epoch,
)

# What a tensor's shape depends on (width, depth, window) and what sets the steps of an epoch
# and the rows of every step (batch_size): docs/fused_tft.md says why the batch size is a key.
KEYED = ("width", "depth", "window", "batch_size")


@dataclass(frozen=True)
class Forecasting:
    """What `adapters.tft` hands the group (it imports this module, so this one does not import
    it back): its training step, built per member as `train` builds it, and its option check."""

    training_step: Callable[[nn.Module, Mapping[str, Any], torch.device], Any]
    sizes: Callable[[Mapping[str, Any]], dict[str, int]]


def fuse_key(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> Hashable:
    """Which forecaster trials may train as one group: equal width, depth, window and batch size.
    It reads only those parameters (the group's other members are asked with them fixed)."""
    present = set(params)  # iterating reads no parameter
    return tuple(int(params[name] if name in present else defaults[name]) for name in KEYED)


def train_fused(
    adapter: Any,
    forecasting: Forecasting,
    members: Sequence[Member],
    *,
    epochs: int,
    device: torch.device,
    options: Mapping[str, Any],
) -> list[float | BaseException]:
    """One entry per member, in order: its value, or what ended it (docs/fused.md)."""
    if len(members) == 1:  # a group of one is exactly a trial
        return [train_alone(adapter, members[0], epochs, device, options)]
    defaults = adapter.default_params
    keys = {fuse_key(member.params, defaults) for member in members}
    if len(keys) > 1:
        raise ValueError(f"members of one fused tft group need one fuse_key, not {sorted(keys)}")
    started = time.perf_counter()
    try:
        data = _Data(adapter, forecasting, {**defaults, **members[0].params}, options, device)
    except Exception as error:  # every member's, as `train` raises it for a trial
        return [error] * len(members)
    runs = [_Run(index, member, defaults, data) for index, member in enumerate(members)]
    last = max(1, epochs)
    with warnings.catch_warnings():
        # vmap runs attention one member after another where torch has no batched rule for
        # it (the CPU's attention kernels): said once per process, not a fault of the group.
        warnings.filterwarnings("ignore", message="There is a performance drop")
        _train(runs, data, last, started)
    return [run.entry if run.entry is not None else run.best for run in runs]


def _train(runs: list[_Run], data: _Data, last: int, started: float) -> None:
    """Every member's epochs, one round (an epoch of every member still going) at a time."""
    group: _Group | None = None
    for run in runs:  # resumed at or past the last epoch: its result, as `train` ends it
        if run.entry is None and run.epoch >= last:
            run.finish(started)
    while True:
        going = [run for run in runs if run.entry is None and not run.done]
        if not going:
            return
        if group is None or group.runs != going:  # a member left: stack the others' rows
            group = _Group(going, data)
        try:
            for _ in range(data.steps):
                group.step()
            values = group.evaluate()
        except Exception as error:  # the fused step's own: it ends every member still in it
            for run in going:
                run.entry = error
            return
        for run, value in zip(going, values, strict=True):
            run.end_epoch(value, last, started)


class _Data:
    """What every member of the group reads alike: the returns, the window starts, the steps of
    an epoch (equal window and batch size, from `fuse_key`)."""

    def __init__(
        self,
        adapter: Any,
        forecasting: Forecasting,
        params: Mapping[str, Any],
        options: Mapping[str, Any],
        device: torch.device,
    ) -> None:
        sizes = forecasting.sizes(options)
        self.training_step = forecasting.training_step
        self.batch_size = int(params["batch_size"])
        self.window, self.horizon = int(params["window"]), sizes["horizon"]
        self.seed = int(options.get("seed", 0))
        self.metric, self.device = adapter.metric, device
        returns = standardised_returns(
            load_close_prices(str(options.get("data", "")), sizes["steps"], self.seed)
        )
        train_starts, val_starts = split_windows(len(returns), self.window, self.horizon)
        self.series = torch.as_tensor(returns, dtype=torch.float32, device=device)
        self.offsets = torch.arange(self.window + self.horizon, device=device)
        self.windows = len(train_starts)
        self.train_starts = torch.as_tensor(train_starts, device=device)
        self.val_starts = torch.as_tensor(val_starts, device=device)
        self.steps = steps_per_epoch(self.windows, self.batch_size)

    def batch(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of windows starting at `starts` (any leading shape), as `train`."""
        rows = self.series[starts.unsqueeze(-1) + self.offsets]
        return rows[..., : self.window], rows[..., self.window :]


class _Run:
    """One member: its model, training step, window stream, best score and where it stands."""

    def __init__(
        self, index: int, member: Member, defaults: Mapping[str, Any], data: _Data
    ) -> None:
        self.index, self.member, self.data = index, member, data
        self.entry: float | BaseException | None = None
        self.best, self.best_epoch, self.epoch = math.inf, 0, 0
        self.done = False
        full = {**defaults, **member.params}
        self.dropout = float(full["dropout"])
        try:
            torch.manual_seed(data.seed)  # the first weights `train` draws for this trial
            self.model = build_forecaster(
                int(full["width"]), data.window, int(full["depth"]), data.horizon, self.dropout
            ).to(data.device)
            self.step = data.training_step(self.model, full, data.device)
            self.stream = ShuffledStream(data.windows, data.seed)
            resumed = _tft_checkpoint.resume(member.checkpoint, self.model, self.step, self.stream)
        except Exception as error:  # its own parameters or checkpoint: it alone fails
            self.entry = error
            return
        self.best, self.best_epoch, self.epoch = resumed

    def log(self, line: str) -> None:
        """A line of the member's trial log: the members share the process's output, so each line
        names the member (its place in the group), which the pool puts in that member's log."""
        trial_log.write_member(self.index, line)

    def end_epoch(self, value: float, last: int, started: float) -> None:
        """After an epoch: log, keep the best, report, save; leave on an exception or at the end."""
        data, epoch = self.data, self.epoch
        seconds = time.perf_counter() - started
        done = f"{(epoch + 1) * data.steps:,} gradient steps of {data.batch_size}"
        self.log(trial_log.evaluation_line(epoch, data.metric, value, seconds, done))
        if not math.isfinite(value):
            self.log(trial_log.value_line(data.metric, math.inf, seconds, "diverged"))
            self.entry = math.inf  # diverged: the worst possible result, as alone
            return
        if value < self.best:
            self.best, self.best_epoch = value, epoch
        try:
            self.member.report(epoch, value)
            best = (self.best, self.best_epoch)
            model = _OwnRow(self.model)
            _tft_checkpoint.save(self.member.checkpoint, epoch, model, self.step, self.stream, best)
        except Exception as error:  # pruned, or its checkpoint failed: it leaves the group
            self.entry = error
            return
        self.epoch += 1
        if self.epoch >= last:
            self.finish(started)

    def finish(self, started: float) -> None:
        """Its last epoch trained: the best epoch's score is its value."""
        how = f"the best epoch's score, step {self.best_epoch}"
        seconds = time.perf_counter() - started
        self.log(trial_log.value_line(self.data.metric, self.best, seconds, how))
        self.done = True


class _OwnRow:
    """A member's model as its checkpoint sees it: its weights are rows of the group's stack,
    and torch.save keeps a view's whole storage, so the state holds copies of its row alone."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.model.state_dict().items()}


class _Group:
    """The members still training: their stacked parameters, and one network to call over them."""

    def __init__(self, runs: list[_Run], data: _Data) -> None:
        from torch.func import functional_call, vmap

        self.runs, self.data = runs, data
        models = [run.model for run in runs]
        self.names = [name for name, _ in models[0].named_parameters()]
        # One leaf per parameter, [N, ...]; each member's own parameter becomes a view of its
        # row, so its optimiser's in-place step updates the stack and no copy is made per step.
        self.params: dict[str, torch.Tensor] = {}
        for name, *own in zip(self.names, *(m.parameters() for m in models), strict=True):
            stacked = torch.stack([p.detach() for p in own]).requires_grad_()
            rows = stacked.detach()
            for row, p in enumerate(own):
                p.data = rows[row]
            self.params[name] = stacked
        self.own = [list(model.parameters()) for model in models]
        self.network, self.buffers = _group_network(models[0], [run.dropout for run in runs])

        def forward(params: Any, buffers: Any, inputs: torch.Tensor) -> torch.Tensor:
            return functional_call(self.network, (params, buffers), (inputs,)).float()

        def loss(params: Any, buffers: Any, inputs: Any, targets: Any) -> torch.Tensor:
            return F.mse_loss(forward(params, buffers, inputs), targets)

        def squared(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(predictions, targets, reduction="sum")

        self.losses = vmap(loss, randomness="different")
        # Held-out windows are the same for every member: one input, N networks.
        self.predict = vmap(forward, in_dims=(0, 0, None), randomness="different")
        self.squared = vmap(squared, in_dims=(0, None))

    def autocast(self) -> Any:
        return self.runs[0].step.autocast()

    def step(self) -> None:
        """One gradient step of every member: one fused forward and backward, then each
        member's own unscale, clip and AdamW step, as `_TrainingStep` takes them alone."""
        data = self.data
        starts = torch.stack(
            [
                data.train_starts[run.stream.take(data.batch_size).to(data.device)]
                for run in self.runs
            ]
        )
        inputs, targets = data.batch(starts)
        self.network.train()
        with self.autocast():
            losses = self.losses(self.params, self.buffers, inputs, targets)
        for stacked in self.params.values():
            stacked.grad = None
        scaled = [run.step.scaler.scale(losses[i]) for i, run in enumerate(self.runs)]
        torch.stack(scaled).sum().backward()
        grads = [self.params[name].grad for name in self.names]
        for i, (run, own) in enumerate(zip(self.runs, self.own, strict=True)):
            for p, grad in zip(own, grads, strict=True):
                p.grad = grad[i]
            step = run.step
            step.scaler.unscale_(step.optimizer)
            torch.nn.utils.clip_grad_norm_(own, 1.0)
            step.scaler.step(step.optimizer)
            step.scaler.update()
            step.optimizer.zero_grad(set_to_none=True)

    def evaluate(self) -> list[float]:
        """Each member's mean squared error over every held-out window, as `tft._evaluate`."""
        data = self.data
        self.network.eval()
        totals, count = [0.0] * len(self.runs), 0
        with torch.no_grad():
            for begin in range(0, len(data.val_starts), data.batch_size):
                inputs, targets = data.batch(data.val_starts[begin : begin + data.batch_size])
                with self.autocast():
                    predictions = self.predict(self.params, self.buffers, inputs)
                sums = self.squared(predictions, targets).tolist()
                totals = [total + value for total, value in zip(totals, sums, strict=True)]
                count += targets.numel()
        return [total / max(1, count) for total in totals]


def _group_network(
    model: torch.nn.Module, rates: list[float]
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A weightless copy of a member's network to call over the stack, and its buffers: none
    when every member has one dropout rate (the layers' own forward), else each dropout's
    rate per member (`[N]`), read by `_RateDropout` and `_RateFusionBlock`."""
    network = copy.deepcopy(model).to("meta")
    if len(set(rates)) == 1:
        return network, {}
    device = next(model.parameters()).device
    rate = torch.tensor(rates, dtype=torch.float32, device=device)
    buffers: dict[str, torch.Tensor] = {}
    for name, module in list(network.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(module, child_name, _RateDropout())
                buffers[f"{name}.{child_name}.rate".lstrip(".")] = rate
        if isinstance(module, FusionBlock):
            module.__class__ = _RateFusionBlock
            buffers[f"{name}.attention_rate"] = rate
    return network, buffers


class _RateDropout(nn.Module):
    """Dropout at a rate that is a value per member (a buffer under vmap), not a constant."""

    rate: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = torch.rand_like(x) >= self.rate
        return x * keep / (1.0 - self.rate)


class _RateFusionBlock(FusionBlock):
    """`FusionBlock` whose attention dropout rate is a value per member: in training the
    attention is written out (softmax, dropout, product), as the fused kernel does inside."""

    attention_rate: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        batch, window, width = x.shape
        qkv = self.qkv(x).view(batch, window, 3, self.heads, width // self.heads)
        q, k, v = (part.transpose(1, 2) for part in qkv.unbind(2))
        scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
        causal = torch.ones(window, window, dtype=torch.bool, device=x.device).tril()
        weights = scores.masked_fill(~causal, -math.inf).softmax(dim=-1)
        keep = torch.rand_like(weights) >= self.attention_rate
        attended = (weights * keep / (1.0 - self.attention_rate)) @ v
        attended = self.out(attended.transpose(1, 2).reshape(batch, window, width))
        return self.grn(self.norm(x + F.glu(self.gate(attended))))
