"""An adapter whose objective misbehaves on purpose, for the tests of what a user then sees.

`--option behave=KIND[,KIND...]` picks what its trials do: `nan`, `inf` or `-inf` (returned as
the value), `exit` (calls `sys.exit(3)`), `hang` (sleeps far past any timeout), `wait` (waits
until the file `release=FILE` exists), or `ok` (returns `x`). With `--option marker=FILE` the
k-th trial to train (the one that creates FILE.k) does the k-th KIND, and every trial after the
list returns `x` at once."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, BaseAdapter


def _turn(marker: str, count: int) -> int | None:
    """Which of the first `count` trials to train this one is (by marker files), else None."""
    for turn in range(count):
        try:
            fd = os.open(f"{marker}.{turn}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        return turn
    return None


class MisbehavingAdapter(BaseAdapter):
    name = "misbehaving"
    workload_class = "supervised"
    model_overhead_mb = 100.0
    per_sample_mb = 0.01
    direction = "minimize"
    metric = "loss"
    uses_torch = False  # its trial processes need not import torch
    options = {"behave": "ok", "marker": "", "release": ""}

    def suggest(self, trial: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "x": trial.suggest_float("x", 0.0, 1.0),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
        }

    def train(self, params, *, epochs, device, options, report) -> float:
        kinds = options["behave"].split(",")
        turn = _turn(options["marker"], len(kinds)) if options["marker"] else 0
        behave = "ok" if turn is None else kinds[turn]
        for epoch in range(epochs):
            report(epoch, params["x"])
        if behave == "exit":
            sys.exit(3)
        if behave == "hang":
            time.sleep(3600)
        while behave == "wait" and not os.path.exists(options["release"]):
            time.sleep(0.1)
        if behave in ("nan", "inf", "-inf"):
            return float(behave)
        return params["x"]


adapter = MisbehavingAdapter()


def objective_that_hangs_first(trial: Any, device: Any) -> float:
    """A plain objective for `orchestrator.optimize`: trial 0 hangs, every later one returns x."""
    x = trial.suggest_float("x", 0.0, 1.0)
    trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True)
    if trial.number == 0:
        time.sleep(3600)
    return x
