"""The synthetic adapter, with trials of a large batch running out of GPU memory mid-training.

`--option oom_epoch=K --option oom_batch_above=B`: a trial whose batch size is above B raises
torch's CUDA out-of-memory error as it starts epoch K, as a model whose activations grow with
the batch does once its longest sequences come. The pool's OOM policy re-queues it (alone on
the GPU with half the batch; crowded, as it is, for a quieter moment); the re-run, which never
runs out of memory, goes on from the trial's last checkpoint (docs/checkpoints.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.synthetic import SyntheticAdapter


class OomAtEpochAdapter(SyntheticAdapter):
    name = "oom-at-epoch"
    options = {**SyntheticAdapter.options, "oom_epoch": 0, "oom_batch_above": 0}

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: str,
        options: Mapping[str, Any],
        report: Any,
        checkpoint: Any = None,
    ) -> float:
        first_run = getattr(checkpoint, "source", None) is None  # a re-run names its trial
        too_big = first_run and 0 < int(options["oom_batch_above"]) < int(params["batch_size"])
        if too_big:  # imported before training: loading torch holds the interpreter for seconds
            import torch  # noqa: F401
        return super().train(
            params,
            epochs=epochs,
            device=device,
            options=options,
            report=report,
            checkpoint=_OomAfter(checkpoint, int(options["oom_epoch"])) if too_big else checkpoint,
        )


class _OomAfter:
    """The trial's handle, raising CUDA's OOM error once epoch K - 1 is reported and saved."""

    def __init__(self, handle: Any, oom_epoch: int) -> None:
        self.handle, self.oom_epoch = handle, oom_epoch
        self.source = getattr(handle, "source", None)

    def load(self) -> Any:
        return None if self.handle is None else self.handle.load()

    def due(self, epoch: int) -> bool:
        return self.handle is not None and self.handle.due(epoch)

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        if self.handle is not None:
            self.handle.save(epoch, state)
        if epoch + 1 == self.oom_epoch:
            import torch

            raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test adapter)")


adapter = OomAtEpochAdapter()
