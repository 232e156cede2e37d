"""The synthetic adapter with a `seed` option and noise drawn from it: the same parameters on
another seed score otherwise, as an RL agent retrained does (for `--intensify`'s tests)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from adapters.synthetic import SyntheticAdapter, params_seed, synthetic_value


class SeededNoisyAdapter(SyntheticAdapter):
    name = "seeded-noisy"
    options = {**SyntheticAdapter.options, "trial_seconds": 0.05, "noise": 1.0, "seed": 0}

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
        rng = random.Random(params_seed(params) * 1_000 + int(options["seed"]))
        value = synthetic_value(params) + float(options["noise"]) * rng.gauss(0.0, 1.0)
        for epoch in range(max(1, epochs)):
            report(epoch, value)
        return value


adapter = SeededNoisyAdapter()
