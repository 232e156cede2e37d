"""A hidden clamp between the optimiser and the training loop would change a batch size unseen.
Here a batch size the plan allows goes from the sampler through the trial process to the
adapter's memory model and the records unchanged."""

from __future__ import annotations

import optuna

from adapters.base import MemoryModel
from orchestrator.gpu.sim import SimProbe, make_sim_devices
from orchestrator.planning.planner import plan_node
from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.study.spec import StudySpec, save_spec
from orchestrator.run.pool.loop import Pool


def test_a_batch_of_2048_allowed_by_the_plan_reaches_the_trial_unclamped(tmp_path, sqlite_url):
    devices = make_sim_devices([81920], str(tmp_path))
    model = MemoryModel(500.0, 0.02)
    plan = plan_node(devices, model, cpu_bound=False, cpu_cores=2, concurrency=1)
    assert plan.gpus[0].batch_bounds[1] >= 2048

    storage = open_storage(StorageLocation.parse(sqlite_url), heartbeat=True)
    study = optuna.create_study(study_name="flow", storage=storage)
    spec = StudySpec(
        adapter="synthetic",
        trials=1,
        epochs=1,
        direction="minimize",
        options={"trial_seconds": 0.0, "overhead_mb": 500.0, "per_sample_mb": 0.02},
        pruner="none",
    )
    save_spec(study, spec)
    study.enqueue_trial(
        {"x": 1.0, "y": -2.0, "learning_rate": 1e-3, "batch_size": 2048, "activation": "gelu"}
    )
    Pool.on_storage(
        storage_location=StorageLocation.parse(sqlite_url),
        engine=storage.engine,
        study=study,
        spec=spec,
        plans=list(plan.gpus),
        probe=SimProbe(devices),
        cpu_cores=2,
    ).run()

    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.params["batch_size"] == 2048
    assert trial.user_attrs["vram_planned_mb"] == round(model.planned_mb(2048), 1)
    (row,) = records.list_trial_vram(storage.engine, "flow")
    assert row["batch_size"] == 2048
    assert row["vram_peak_mb"] == model.planned_mb(2048)  # what the simulated trial really held
