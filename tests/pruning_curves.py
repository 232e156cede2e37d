"""An adapter whose learning curves are chosen per trial, so that a test knows which trials a
pruner must stop: `--option curves=gggwr` gives trial 0, 1, 2 a good curve, trial 3 a worse one
and trial 4 a rising one (the last letter repeats for later trials). Used with `--adapter-path
pruning_curves:adapter` and `tests/` on PYTHONPATH.

    g  good:   1 + 1/(epoch+1), improving towards 1
    w  worse:  10 + 1/(epoch+1), improving too, but always far behind the good ones
    r  rising: 10 + epoch, getting worse every epoch (overfitting)
"""

from __future__ import annotations

from typing import Any

from adapters.synthetic import SyntheticAdapter

CURVES = {
    "g": lambda epoch: 1.0 + 1.0 / (epoch + 1),
    "w": lambda epoch: 10.0 + 1.0 / (epoch + 1),
    "r": lambda epoch: 10.0 + epoch,
}


class CurvesAdapter(SyntheticAdapter):
    name = "curves"
    metric = "loss"
    options = {**SyntheticAdapter.options, "trial_seconds": 0.0, "curves": "g"}

    def suggest(self, trial, options) -> dict[str, Any]:
        params = super().suggest(trial, options)
        plan = str(options["curves"])
        params["curve"] = plan[min(trial.number, len(plan) - 1)]
        return params

    def train(self, params, *, epochs, device, options, report) -> float:
        curve = CURVES[params["curve"]]
        for epoch in range(epochs):
            report(epoch, curve(epoch))
        return curve(epochs - 1)


adapter = CurvesAdapter()
