"""An adapter for the trial-lifecycle tests: it can leak memory, or fail once with a CUDA error
or an out-of-memory error, so that tests can watch warm trial processes being recycled."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, BaseAdapter

_LEAKED: list[bytes] = []  # what a leaking model keeps from trial to trial


def _first_time(marker: str) -> bool:
    """True once per marker file: the first trial of the whole study to get here."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class LifecycleAdapter(BaseAdapter):
    name = "lifecycle"
    workload_class = "supervised"
    model_overhead_mb = 100.0
    per_sample_mb = 0.01
    direction = "minimize"
    metric = "loss"
    options = {"leak_mb": 0.0, "fail_once": "", "marker": "", "cuda_mb": 0.0}

    def suggest(self, trial: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "x": trial.suggest_float("x", 0.0, 1.0),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
        }

    def train(self, params, *, epochs, device, options, report) -> float:
        import torch

        if options["leak_mb"]:
            _LEAKED.append(b"\x01" * int(options["leak_mb"] * 2**20))  # touched, so resident
        if options["fail_once"] and _first_time(options["marker"]):
            if options["fail_once"] == "cuda":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test adapter)")
        if options["cuda_mb"] and device.type == "cuda":
            block = torch.empty(int(options["cuda_mb"] * 2**20), dtype=torch.uint8, device=device)
            block.fill_(1)
            del block
        for epoch in range(epochs):
            report(epoch, params["x"])
        return params["x"]


adapter = LifecycleAdapter()
