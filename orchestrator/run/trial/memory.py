"""A trial's memory in its process: reset before it, measured as it trains, given back after.

On a real GPU the peak is torch's `max_memory_reserved` for this trial alone (the cache is
emptied and the peak statistics reset between trials); on a simulated GPU it is what the trial
holds in the ledger, which grows to its full need at its first report, as a real trial's memory
grows over its first steps. Each epoch the supervisor hears the peak so far.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from orchestrator.gpu.sim import process_holder
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.base import Report
    from orchestrator.run.messages import Channel
    from orchestrator.run.trial.context import TrialContext
    from orchestrator.run.trial.result import RunResult
else:
    torch = LazyImport("torch")


def reporting_memory(
    ctx: TrialContext, result: RunResult, channel: Channel, report: Report
) -> Report:
    """Each epoch, tell the supervisor what the trial really holds (its peak so far), so it
    counts a running trial at that instead of its estimate. On a simulated GPU the trial's
    batches take their memory at its first report, as a real trial's memory grows over its first
    steps: free memory does not show a trial that has just started."""
    if ctx.ledger is None and not ctx.on_cuda:
        return report

    def reporting(epoch: int, value: float) -> None:
        hold_simulated(ctx, result)
        peak = measure_vram_peak_mb(ctx)
        if peak is not None:
            channel.send(("vram_peak_mb", peak))
        report(epoch, value)

    return reporting


def hold_simulated(ctx: TrialContext, result: RunResult) -> None:
    """Hold, on a simulated GPU, all the trial really needs: the adapter's declared model at its
    batch size times --sim-memory-scale (raises CUDA's OOM error if it does not fit)."""

    hold_simulated_mb(ctx, ctx.memory.planned_mb(result.batch_size or 0))


def hold_simulated_mb(ctx: TrialContext, planned_mb: float) -> None:
    """Hold `planned_mb` (times --sim-memory-scale) on a simulated GPU: what this process's
    trial, or fused group of trials, really needs by the memory model."""
    if ctx.ledger is None:
        return
    holder = process_holder()
    need = planned_mb * ctx.config.settings.sim_memory_scale
    more = need - ctx.ledger.held_mb(holder)
    if more > 0:
        ctx.ledger.allocate(holder, more)


def reset_memory(ctx: TrialContext) -> None:
    """Start the trial's peak from what it allocates itself, not from the trial before it."""
    if ctx.on_cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def measure_vram_peak_mb(ctx: TrialContext) -> float | None:
    if ctx.ledger is not None:
        return ctx.ledger.held_mb(process_holder())
    if ctx.on_cuda:
        return torch.cuda.max_memory_reserved() / 2**20
    return None


def release_memory(ctx: TrialContext) -> None:
    """Give back what the trial held (outside any except block, so its traceback is gone).

    Only a GPU needs the collection now (tensors in reference cycles hold VRAM that the next
    trial, or its peak, would otherwise count); on the CPU it would cost every trial ~100 ms."""
    if ctx.on_cuda:
        gc.collect()
        torch.cuda.empty_cache()
    if ctx.ledger is not None:
        ctx.ledger.release(process_holder())
