"""The synthetic adapter with a `seed` option and noise drawn from it: the same parameters on
another seed score otherwise, as an RL agent retrained does (for `--intensify`'s tests). With
`oom_marker` set, the first run on a seed other than 0 (the first re-run) runs out of memory."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Any

from adapters.synthetic import SyntheticAdapter, params_seed, synthetic_value


class SeededNoisyAdapter(SyntheticAdapter):
    name = "seeded-noisy"
    options = {
        **SyntheticAdapter.options,
        "trial_seconds": 0.05,
        "noise": 1.0,
        "seed": 0,
        "oom_marker": "",
    }

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
        if options["oom_marker"] and int(options["seed"]) != 0 and _first(options["oom_marker"]):
            raise RuntimeError("CUDA error: out of memory (raised by the test adapter)")
        value = seeded_value(params, options)
        for epoch in range(max(1, epochs)):
            report(epoch, value)
        return value


def seeded_value(params: Mapping[str, Any], options: Mapping[str, Any]) -> float:
    """What a run of `params` scores on `options["seed"]`."""
    rng = random.Random(params_seed(params) * 1_000 + int(options["seed"]))
    return synthetic_value(params) + float(options["noise"]) * rng.gauss(0.0, 1.0)


def _first(marker: str) -> bool:
    """True once per marker file, whichever trial process gets here first."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


adapter = SeededNoisyAdapter()
