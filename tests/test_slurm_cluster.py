"""`slurm` on a real Slurm cluster (tests/slurm_cluster.py): real sbatch, real workers, PostgreSQL.

One cluster for the module (two nodes, two GPU GRES each, simulated devices standing in for the
allotted GPUs); each test has a PostgreSQL database of its own, a study of the synthetic adapter
with short trials, and submits it with `python -m orchestrator slurm --study NAME`. A trial stopped
by `scancel` or a node set DOWN is re-run from its last checkpoint, kept in a folder both share.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.deploy.slurm import SIM_GPU_ENV
from orchestrator.record.store.location import STORAGE_ENV, StorageLocation
from tests.cli_helpers import cli_env, run_cli
from tests.slurm_cluster import CRED_EXPIRE, NODES, SlurmCluster

GPU_MB = "1024"  # one synthetic trial at a time per simulated GPU: 4 trial processes in all


@pytest.fixture(scope="module")
def cluster():
    with SlurmCluster.create() as started:
        yield started


def make_study(
    url: str,
    name: str,
    *,
    trials: int,
    seconds: float,
    epochs: int = 2,
    artifacts: str | None = None,
) -> None:
    import optuna

    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.study.spec import StudySpec, save_spec

    storage = open_storage(StorageLocation.parse(url))
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize")
    spec = StudySpec.new(
        adapter="synthetic",
        trials=trials,
        epochs=epochs,
        direction="minimize",
        sampler="random",
        pruner="none",
        options={"trial_seconds": seconds},
        artifacts=artifacts,  # a folder both nodes share: checkpoints (docs/checkpoints.md)
    )
    save_spec(study, spec)
    storage.engine.dispose()


def submit(cluster: SlurmCluster, url: str, study: str, folder: Path, gpus: int = 2) -> str:
    env = cli_env(**{STORAGE_ENV: url, SIM_GPU_ENV: GPU_MB, "SLURM_CONF": str(cluster.conf)})
    done = run_cli(
        *("slurm", "--study", study, "--nodes", "2", "--gpus-per-node", str(gpus)),
        cwd=folder,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    match = re.search(r"submitted Slurm job (\d+)", done.stdout)
    assert match, done.stdout
    assert f"squeue -j {match[1]}" in done.stdout
    return match[1]


def wait_until(what: str, check, timeout: float = 240.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def trial_states(url: str, study: str) -> Counter:
    import optuna

    from orchestrator.record.store.storage import create_storage

    storage = create_storage(StorageLocation.parse(url))
    try:
        trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
        return Counter(t.state.name for t in trials)
    finally:
        storage.engine.dispose()


def worker_rows(url: str, study: str) -> list:
    import sqlalchemy as sa

    from orchestrator.record.store.records import workers

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = workers.select().where(workers.c.study_name == study)
            return list(conn.execute(query.order_by(workers.c.id)))
    finally:
        engine.dispose()


def task_log(folder: Path, study: str, job: str, task: int) -> str:
    path = folder / f"orch-{study}-{job}_{task}.log"
    return path.read_text() if path.exists() else ""


RUNNING_HERE = re.compile(r"sim:\d+ [1-9]\d* running")


def ran_trials(log: str) -> bool:
    """The task's progress lines show a trial running on one of its own GPUs."""
    return RUNNING_HERE.search(log) is not None


def runs_a_trial_now(log: str) -> bool:
    """The task's latest progress line shows a trial running on one of its GPUs."""
    progress = [line for line in log.splitlines() if " trials · " in line]
    return bool(progress) and RUNNING_HERE.search(progress[-1]) is not None


def wait_for_a_trial_on_task(folder: Path, study: str, job: str, task: int) -> None:
    wait_until(
        f"a trial running on task {task}",
        lambda: runs_a_trial_now(task_log(folder, study, job, task)),
        timeout=120,
        every=0.2,
    )


def wait_for_a_checkpoint(url: str, study: str) -> None:
    """Until a running trial has saved a checkpoint (epoch 0 or later)."""

    def saved() -> bool:
        import optuna

        from orchestrator.record.store.storage import create_storage

        storage = create_storage(StorageLocation.parse(url))
        try:
            trials = optuna.load_study(study_name=study, storage=storage).get_trials()
        finally:
            storage.engine.dispose()
        return any(t.state.name == "RUNNING" and "checkpoint" in t.user_attrs for t in trials)

    wait_until("a running trial's checkpoint", saved, timeout=120, every=0.3)


def assert_reruns_resumed(url: str, study: str, epochs: int) -> int:
    """Every stopped trial that had saved a checkpoint was re-run from it, its curve carried
    over; returns how many were."""
    import optuna

    from orchestrator.record.store.storage import create_storage

    storage = create_storage(StorageLocation.parse(url))
    try:
        trials = optuna.load_study(study_name=study, storage=storage).get_trials()
    finally:
        storage.engine.dispose()
    resumed = 0
    for stopped in (t for t in trials if t.state.name == "FAIL" and "checkpoint" in t.user_attrs):
        saved = stopped.user_attrs["checkpoint"]["epoch"]
        rerun = next(t for t in trials if t.user_attrs.get("retry_of") == stopped.number)
        if rerun.state.name == "FAIL":  # stopped again: its own re-run goes on from it
            continue
        assert rerun.user_attrs.get("resumed_from_epoch") == saved, (stopped, rerun)
        assert sorted(rerun.intermediate_values) == list(range(epochs)), rerun
        assert rerun.intermediate_values[saved] == stopped.intermediate_values[saved]
        resumed += 1
    return resumed


def assert_budget_exact(url: str, study: str, trials: int, logs: list[str]) -> Counter:
    states = trial_states(url, study)
    assert states["COMPLETE"] == trials, (states, logs)
    assert states["RUNNING"] == 0, (states, logs)
    return states


def finish(cluster: SlurmCluster, job: str, folder: Path, study: str, timeout: float = 150.0):
    """Wait for every task of the job to end (cancelled at the end whatever happens)."""
    try:
        wait_until("the array to finish", lambda: not cluster.job_states(job), timeout=timeout)
    except AssertionError as error:
        logs = "\n".join(task_log(folder, study, job, task)[-3000:] for task in range(2))
        raise AssertionError(f"{error}; the tasks' logs:\n{logs}") from None
    finally:
        cluster.run("scancel", job, check=False)


def test_two_nodes_share_one_study_and_its_exact_budget(cluster, postgres_url, tmp_path) -> None:
    make_study(postgres_url, "spread", trials=6, seconds=2.0)
    job = submit(cluster, postgres_url, "spread", tmp_path)
    finish(cluster, job, tmp_path, "spread")
    logs = [task_log(tmp_path, "spread", job, task) for task in range(2)]
    assert_budget_exact(postgres_url, "spread", 6, logs)
    assert all(ran_trials(log) for log in logs), logs  # both nodes contributed
    rows = worker_rows(postgres_url, "spread")
    # Each node's worker ran its two GPUs, and recorded the array task it ran as.
    assert Counter((r.slurm_job, r.slurm_node) for r in rows) == {
        (f"{job}_0", NODES[0]): 2,
        (f"{job}_1", NODES[1]): 2,
    } or {r.slurm_node for r in rows} == set(NODES), [tuple(r) for r in rows]
    for log in logs:
        assert "worker exited with status 0" in log, log
    status = run_cli("status", "--study", "spread", "--storage", postgres_url)
    (tmp_path / "status.txt").write_text(status.stdout)  # what docs/deploy.md shows
    assert f"{job}_0 on " in status.stdout and f"{job}_1 on " in status.stdout, status.stdout


def test_a_cancelled_task_requeues_its_trial_for_the_other_node(
    cluster, postgres_url, tmp_path
) -> None:
    # scancel lands mid-trial, after a checkpoint: the re-run on the other node goes on from it.
    # A task's progress line comes every 10 s and the first one may show its trials not yet
    # admitted: trials of 24 s are still running when the second one has shown them.
    make_study(
        postgres_url, "cancel", trials=4, seconds=24.0, epochs=4, artifacts=str(tmp_path / "ckpt")
    )
    job = submit(cluster, postgres_url, "cancel", tmp_path)
    wait_for_a_trial_on_task(tmp_path, "cancel", job, 0)
    wait_for_a_checkpoint(postgres_url, "cancel")
    cluster.run("scancel", f"{job}_0")
    finish(cluster, job, tmp_path, "cancel")
    cancelled, other = (task_log(tmp_path, "cancel", job, task) for task in range(2))
    states = assert_budget_exact(postgres_url, "cancel", 4, [cancelled, other])
    assert "SIGTERM received" in cancelled, cancelled
    assert "stopped and re-queued" in cancelled, cancelled
    assert "the task ends with status 0" in cancelled, cancelled
    assert sum(states.values()) > 4, states  # the stopped trial ended, its parameters ran again
    assert "done: 4/4 trials" in other, other  # finished elsewhere
    assert assert_reruns_resumed(postgres_url, "cancel", 4) >= 1


def test_a_node_that_goes_down_comes_back_and_the_budget_stays_exact(
    cluster, postgres_url, tmp_path
) -> None:
    make_study(
        postgres_url, "down", trials=4, seconds=12.0, epochs=4, artifacts=str(tmp_path / "ckpt")
    )
    job = submit(cluster, postgres_url, "down", tmp_path)  # a task takes a node's two GPUs
    wait_for_a_trial_on_task(tmp_path, "down", job, 0)
    wait_for_a_checkpoint(postgres_url, "down")
    first = task_log(tmp_path, "down", job, 0).splitlines()[0]
    node = re.search(r" on (\w+):", first)[1]
    cluster.set_node(node, "down")
    task = f"{job}_0"
    try:
        wait_until(
            "the task to be requeued", lambda: cluster.job_states(task).get(task) == "PENDING"
        )
    finally:
        cluster.set_node(node, "resume")

    # Slurm holds a requeued job back for the credential's lifetime (CRED_EXPIRE here, 120 s by
    # default): starting it sooner on the same node is refused by its slurmd, and the task ends.
    wait_until(
        "the task to come back",
        lambda: ", restart 1" in task_log(tmp_path, "down", job, 0),
        timeout=CRED_EXPIRE + 150,
        every=1,
    )
    finish(cluster, job, tmp_path, "down")
    logs = [task_log(tmp_path, "down", job, task) for task in range(2)]
    assert f"slurm job {task} on " in logs[0] and ", restart 1" in logs[0], logs[0]
    assert_budget_exact(postgres_url, "down", 4, logs)
    rows = worker_rows(postgres_url, "down")
    assert any(r.slurm_job == task and r.slurm_restarts == 1 for r in rows), rows
    assert assert_reruns_resumed(postgres_url, "down", 4) >= 1


def test_slurm_creates_the_study_with_its_settings_and_puts_one_task_on_each_node(
    cluster, postgres_url, tmp_path
) -> None:
    """No study made beforehand: `slurm ADAPTER` stores run's settings (--artifacts among them,
    so a PostgreSQL study keeps checkpoints) and submits. One GPU asked of nodes of two: without
    --exclusive both tasks landed on one node; each now has a node, and uses the one GPU asked."""
    artifacts = tmp_path / "ckpt"
    env = cli_env(
        **{STORAGE_ENV: postgres_url, SIM_GPU_ENV: GPU_MB, "SLURM_CONF": str(cluster.conf)}
    )
    done = run_cli(
        "slurm", "synthetic", "--study", "settled", "--nodes", "2", "--gpus-per-node", "1",
        "--trials", "4", "--epochs", "3", "--sampler", "random", "--pruner", "none",
        "--option", "trial_seconds=1.5", "--checkpoint-every", "1", "--artifacts", str(artifacts),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "study 'settled' created" in done.stdout
    job = re.search(r"submitted Slurm job (\d+)", done.stdout)[1]
    finish(cluster, job, tmp_path, "settled")
    logs = [task_log(tmp_path, "settled", job, task) for task in range(2)]
    assert_budget_exact(postgres_url, "settled", 4, logs)
    nodes = [re.search(r" on (\w+): GPUs (\d+(?:,\d+)*)", log) for log in logs]
    assert all(nodes), logs
    assert {found[1] for found in nodes} == set(NODES), logs  # one task on each node
    assert all(found[2] in ("0", "1") for found in nodes), logs  # one GPU each, as asked
    import optuna

    from orchestrator.record.store.storage import create_storage
    from orchestrator.record.study.spec import load_spec

    storage = create_storage(StorageLocation.parse(postgres_url))
    try:
        study = optuna.load_study(study_name="settled", storage=storage)
        spec, trials = load_spec(study), study.get_trials()
    finally:
        storage.engine.dispose()
    assert (spec.trials, spec.epochs, spec.checkpoint_every) == (4, 3, 1)
    assert spec.artifacts == str(artifacts)
    assert all("checkpoint" in t.user_attrs for t in trials), [t.user_attrs for t in trials]
    assert all(sorted(t.intermediate_values) == [0, 1, 2] for t in trials)
