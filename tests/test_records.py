"""Our tables take concurrent writers on several nodes: one statement each, no lost update."""

from __future__ import annotations

import multiprocessing as mp

import sqlalchemy as sa

from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage


def _write(url: str, limit: int) -> None:
    engine = sa.create_engine(StorageLocation.parse(url).url)
    for step in range(5):
        records.lower_batch_limit(
            engine, study_name="s", gpu_name="L4", max_batch_size=limit + step, trial_number=limit
        )
        records.save_memory_model(
            engine,
            adapter="dqn",
            gpu_name="L4",
            model_overhead_mb=limit,
            per_sample_mb=0.1,
            source="trials",
            samples=5,
        )


def test_concurrent_batch_limits_keep_the_lowest_and_models_do_not_collide(storage_url):
    storage = open_storage(StorageLocation.parse(storage_url))
    context = mp.get_context("spawn")
    writers = [
        context.Process(target=_write, args=(storage_url, limit)) for limit in (300, 400, 500)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert [w.exitcode for w in writers] == [0, 0, 0]
    assert records.load_batch_limit(storage.engine, study_name="s", gpu_name="L4") == 300
    model = records.load_memory_model(storage.engine, adapter="dqn", gpu_name="L4")
    assert model.model_overhead_mb in (300, 400, 500) and model.samples == 5


def test_a_limit_only_goes_down(sqlite_url):
    storage = open_storage(StorageLocation.parse(sqlite_url))
    for limit in (900, 1200, 700, 800):
        records.lower_batch_limit(
            storage.engine, study_name="s", gpu_name="g", max_batch_size=limit, trial_number=limit
        )
    assert records.load_batch_limit(storage.engine, study_name="s", gpu_name="g") == 700
