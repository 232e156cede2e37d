"""The synthetic adapter, with trials of a large batch running out of GPU memory mid-training.

`--option oom_epoch=K --option oom_batch_above=B`: a trial whose batch size is above B raises
torch's CUDA out-of-memory error as it starts epoch K, as a model whose activations grow with
the batch does once its longest sequences come. The pool's OOM policy re-queues it alone with
half the batch; the re-run goes on from the trial's last checkpoint (docs/checkpoints.md).
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
        too_big = 0 < int(options["oom_batch_above"]) < int(params["batch_size"])
        if too_big:  # imported before training: loading torch holds the interpreter for seconds
            import torch  # noqa: F401

        def reporting(epoch: int, value: float) -> None:
            report(epoch, value)
            if too_big and epoch + 1 == int(options["oom_epoch"]):
                import torch

                raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test adapter)")

        return super().train(
            params,
            epochs=epochs,
            device=device,
            options=options,
            report=reporting,
            checkpoint=checkpoint,
        )


adapter = OomAtEpochAdapter()
