"""A worker under Slurm records its job, node and restarts; `status` shows them beside it."""

from __future__ import annotations

import optuna

from orchestrator.cli import main
from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.trials.slurm_task import SlurmTask, slurm_task_of

ARRAY_TASK = {
    "SLURM_JOB_ID": "42",
    "SLURM_ARRAY_JOB_ID": "41",
    "SLURM_ARRAY_TASK_ID": "1",
    "SLURMD_NODENAME": "n2",
    "SLURM_RESTART_COUNT": "1",
}


def test_the_slurm_task_is_read_from_its_environment() -> None:
    assert slurm_task_of({}) is None
    assert slurm_task_of(ARRAY_TASK) == SlurmTask(job="41_1", node="n2", restarts=1)
    plain = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "gpu-3"}
    assert slurm_task_of(plain) == SlurmTask(job="7", node="gpu-3", restarts=0)
    assert slurm_task_of({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "x"}).restarts == 0


def test_status_shows_each_workers_slurm_job_only_where_one_ran(tmp_path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(StorageLocation.parse(url))
    optuna.create_study(study_name="syn", storage=storage)
    kinds = {"host": "box", "gpu_name": "Simulated GPU", "study_name": "syn"}
    records.register_worker(storage.engine, gpu_index=0, pid=11, environ={}, **kinds)
    assert main(["status", "--study", "syn", "--storage", url]) == 0
    assert "Slurm job" not in capsys.readouterr().out  # no Slurm, no column

    records.register_worker(storage.engine, gpu_index=1, pid=12, environ=ARRAY_TASK, **kinds)
    assert main(["status", "--study", "syn", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "Slurm job" in out
    assert "41_1 on n2, restart 1" in out
    with storage.engine.connect() as conn:
        rows = conn.execute(records.workers.select().order_by(records.workers.c.id)).all()
    assert [(r.slurm_job, r.slurm_node, r.slurm_restarts) for r in rows] == [
        (None, None, None),
        ("41_1", "n2", 1),
    ]
