"""Population-based training through the Python API: a PBTSampler object given to `optimize`."""

from __future__ import annotations

from optuna.trial import TrialState

import orchestrator
from orchestrator.record.checkpoints import lineage as names
from samplers import PBTSampler
from tests.pbt_objective import objective


def test_optimize_trains_a_population_from_checkpoints(sqlite_url):
    study = orchestrator.optimize(
        objective,
        n_trials=6,
        storage=sqlite_url,
        gpus="sim:24576",
        memory_model=(200.0, 0.5),
        batch_sizes=(64, 1024),
        epochs=3,
        pruner="none",
        direction="minimize",
        sampler=PBTSampler(population=2, interval=1),
    )
    trials = {t.number: t for t in study.trials}
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials.values())
    continued = [t for t in trials.values() if t.user_attrs[names.PBT_PARENT] is not None]
    assert len(continued) >= 2
    for t in continued:
        parent = trials[t.user_attrs[names.PBT_PARENT]]
        start = t.user_attrs[names.PBT_START_EPOCH]
        assert t.user_attrs["resumed_from_epoch"] == start - 1
        assert sorted(t.intermediate_values) == list(range(start + 1))  # the parent's, then its own
        assert t.intermediate_values[start - 1] == parent.intermediate_values[start - 1]
        assert t.value < parent.value  # it went on training: the number moved on towards 1
