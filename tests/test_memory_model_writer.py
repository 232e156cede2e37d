"""One writer for a learnt memory model: what a run learnt (an OOM's floor included) and what its
trials measured are merged by one rule, so the end-of-run refinement cannot drop the floor."""

from __future__ import annotations

from types import SimpleNamespace

from adapters.base import MemoryModel
from orchestrator.launch import _refine_memory_models
from orchestrator.planning.footprint import Footprint, observe_oom, observe_peak
from orchestrator.planning.memory import learnt_model, measured_models, save_learnt_model
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.store.records import load_memory_model, record_trial_vram
from orchestrator.run.pool.stored_study import StoredStudy

GPU = "NVIDIA L4"
DECLARED = MemoryModel(1000.0, 10.0)
ROOM_MB = 3000.0  # the room the batch-64 trial ran out of memory in
FINISHED = [(16, 1160.0), (32, 1320.0), (48, 1480.0), (64, 1640.0), (96, 1960.0)]


def _a_run_that_oomed(engine) -> Footprint:
    """Five trials peak where the declared model says; a sixth, at batch 64, OOMs in 3,000 MB."""
    footprint = Footprint(DECLARED, "declared")
    for number, (batch, peak) in enumerate(FINISHED):
        footprint = observe_peak(footprint, batch, peak)
        record_trial_vram(
            engine, study_name="s", trial_number=number, host="h", gpu_index=0, gpu_name=GPU,
            batch_size=batch, vram_peak_mb=peak, concurrency=2, oom=False, state="COMPLETE",
        )  # fmt: skip
    footprint = observe_oom(footprint, 64, ROOM_MB)
    record_trial_vram(
        engine, study_name="s", trial_number=len(FINISHED), host="h", gpu_index=0, gpu_name=GPU,
        batch_size=64, vram_peak_mb=None, concurrency=2, oom=True, state="FAIL",
    )  # fmt: skip
    return footprint


def _stored(url: str) -> MemoryModel:
    ((model, _source),) = measured_models(
        StorageLocation.parse(url), "synthetic", DECLARED, [GPU]
    ).values()
    return model


def test_the_end_of_run_refinement_keeps_the_oom_floor(storage_url) -> None:
    storage = open_storage(StorageLocation.parse(storage_url))
    footprint = _a_run_that_oomed(storage.engine)
    stored_study = StoredStudy(
        storage_location=StorageLocation.parse(storage_url),
        engine=storage.engine,
        study=SimpleNamespace(study_name="s"),
        spec=SimpleNamespace(trials=10, direction="minimize"),
        adapter_name="synthetic",
    )
    stored_study.save_footprint(GPU, footprint)  # what the pool stores as the OOM is heard
    assert _stored(storage_url).planned_mb(64) > ROOM_MB

    devices = [SimpleNamespace(name=GPU, kind="cuda")]
    _refine_memory_models(storage, "synthetic", "s", devices, [(GPU, footprint)])

    # the next plan must not admit a batch-64 trial into the room it ran out of memory in
    assert _stored(storage_url).planned_mb(64) > ROOM_MB


def test_without_an_oom_the_trials_fit_is_stored_as_it_was() -> None:
    footprint = Footprint(DECLARED, "declared")
    for batch, peak in FINISHED:
        footprint = observe_peak(footprint, batch, peak * 0.5)
    fitted = (MemoryModel(500.0, 5.0), 5)
    assert learnt_model(fitted, [footprint]) == fitted


def test_the_floor_of_every_footprint_raises_the_fit() -> None:
    oomed = observe_oom(Footprint(DECLARED, "declared"), 64, ROOM_MB)
    floor = oomed.oom_floor()
    assert floor is not None and floor.planned_mb(64) > ROOM_MB
    model, samples = learnt_model((MemoryModel(500.0, 50.0), 7), [Footprint(DECLARED, "x"), oomed])
    assert model == MemoryModel(floor.model_overhead_mb, 50.0)
    assert samples == 7


def test_while_the_trials_say_too_little_the_footprints_decide() -> None:
    assert learnt_model(None, [Footprint(DECLARED, "declared")]) is None  # learnt nothing
    oomed = observe_oom(observe_peak(Footprint(DECLARED, "d"), 32, 1320.0), 64, ROOM_MB)
    assert learnt_model(None, [oomed]) == (oomed.effective_model(), 1)


def test_a_calibration_keeps_its_source_and_a_run_after_it_stores_trials(sqlite_url) -> None:
    engine = open_storage(StorageLocation.parse(sqlite_url)).engine
    calibrated = MemoryModel(900.0, 9.0)
    save_learnt_model(engine, adapter="synthetic", gpu_name=GPU, calibration=(calibrated, 2))
    stored = load_memory_model(engine, adapter="synthetic", gpu_name=GPU)
    assert (stored.model_overhead_mb, stored.source, stored.samples) == (900.0, "calibration", 2)

    footprint = _a_run_that_oomed(engine)
    model = save_learnt_model(
        engine, adapter="synthetic", gpu_name=GPU, footprints=[footprint], study_names=["s"]
    )
    stored = load_memory_model(engine, adapter="synthetic", gpu_name=GPU)
    assert (stored.source, stored.samples) == ("trials", len(FINISHED))
    assert model is not None and model.planned_mb(64) > ROOM_MB
