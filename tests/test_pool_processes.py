"""Real trial processes on simulated GPUs: OOM halving and re-runs, the watchdog, a killed
worker, and two workers with different GPUs on one PostgreSQL study."""

from __future__ import annotations

import os
import signal

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from orchestrator.gpu.sim import SimLedger, SimProbe, make_sim_devices
from orchestrator.planning.planner import plan_node
from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.study.spec import StudySpec, count_trials, save_spec
from orchestrator.run.pool.loop import Pool
from tests.cli_helpers import cli_env, run_cli, start_cli
from tests.waiting import patient, stored_study, wait_for

VRAM_ATTRS = (
    "vram_peak_mb",
    "vram_planned_mb",
    "gpu",
    "gpu_index",
    "host",
    "concurrency",
    "batch_bounds",
    "oom",
)


def _engine(url):
    return sa.create_engine(StorageLocation.parse(url).url)


def _study(url, name):
    return stored_study(url, name)


def _assert_every_trial_recorded(url, name):
    study = _study(url, name)
    ran = [
        t
        for t in study.trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    ]
    rows = records.list_trial_vram(_engine(url), name)
    numbers = {row["trial_number"] for row in rows}
    for trial in ran:
        missing = [attr for attr in VRAM_ATTRS if attr not in trial.user_attrs]
        assert not missing, f"trial {trial.number} lacks {missing}"
        assert trial.number in numbers
    return study, rows


def test_an_oom_fails_only_its_trial_which_is_re_run(sqlite_url):
    # Seed 0's first trial draws batch 3094: 3 x (50 + 3094) MB cannot fit a 6000 MB GPU even
    # alone. It fails, that batch size becomes the GPU's limit, and it is re-run at half of it.
    # A grace of 30 s, not the tests' 3: on a loaded machine a trial process can miss its
    # heartbeat for 3 s, and a trial failed as lost is another test's case, not this one's.
    done = run_cli(
        "run",
        "synthetic",
        "--trials",
        "8",
        "--seed",
        "0",
        "--storage",
        sqlite_url,
        "--gpus",
        "sim:6000",
        "--sim-memory-scale",
        "3",
        "--option",
        "overhead_mb=50",
        "--option",
        "per_sample_mb=1.0",
        "--option",
        "trial_seconds=2",
        "--epochs",
        "2",
        "--pruner",
        "none",
        timeout=600,
        env=cli_env(ORCHESTRATOR_GRACE_PERIOD="30"),
    )
    assert done.returncode == 0, done.stderr
    study, rows = _assert_every_trial_recorded(sqlite_url, "synthetic")
    count = count_trials(study.trials)
    assert count.counted == 8 and count.running == 0 and count.waiting == 0
    oomed = [t for t in study.trials if t.user_attrs.get("oom")]
    assert oomed and all(t.state == TrialState.FAIL for t in oomed)
    reruns = {
        t.system_attrs["retry_history"][-1]: t
        for t in study.trials
        if t.system_attrs.get("retry_history")
    }
    for trial in oomed:
        rerun = reruns.get(trial.number)
        assert rerun is not None, f"OOM'd trial {trial.number} was not re-run"
        assert {k: v for k, v in rerun.params.items() if k != "batch_size"} == {
            k: v for k, v in trial.params.items() if k != "batch_size"
        }
    assert any(row["oom"] for row in rows)
    limit = records.load_batch_limit(
        _engine(sqlite_url), study_name="synthetic", gpu_name="Simulated GPU 5.86 GB"
    )
    assert limit is not None and limit < oomed[0].params["batch_size"]


def test_the_watchdog_halves_the_memory_when_another_process_holds_it(tmp_path, sqlite_url):
    devices = make_sim_devices([6000], str(tmp_path))
    ledger = SimLedger(devices[0].ledger_path, 6000)
    ledger.allocate("another process", 5500)  # 500 MB free: under 10%
    storage = open_storage(StorageLocation.parse(sqlite_url), heartbeat=True)
    study = optuna.create_study(study_name="watch", storage=storage)
    spec = StudySpec(
        adapter="synthetic",
        trials=2,
        epochs=1,
        direction="minimize",
        options={"trial_seconds": 0.1, "overhead_mb": 20.0, "per_sample_mb": 0.01},
        pruner="none",
    )
    save_spec(study, spec)
    from adapters.base import MemoryModel

    plan = plan_node(devices, MemoryModel(20.0, 0.01), cpu_bound=False, cpu_cores=2, concurrency=4)
    pool = Pool.on_storage(
        storage_location=StorageLocation.parse(sqlite_url),
        engine=storage.engine,
        study=study,
        spec=spec,
        plans=list(plan.gpus),
        probe=SimProbe(devices),
        cpu_cores=2,
    )
    result = pool.run()
    assert result.trials_run >= 2
    events = records.list_concurrency_events(storage.engine, "watch")
    watchdog = [
        e for e in events if e.reason in ("watchdog", "degrade") and "free" in (e.detail or "")
    ]
    assert watchdog, [(e.reason, e.detail) for e in events]
    assert (watchdog[0].from_mb, watchdog[0].to_mb) == (2400.0, 1200.0)  # half of 80% of 6000
    assert count_trials(study.trials).complete == 2
    assert ledger.held_mb("another process") == 5500  # ours came and went; theirs stayed


def test_a_killed_worker_s_trial_is_failed_by_heartbeat_and_re_run_by_a_survivor(postgres_url):
    common = ("--storage", postgres_url, "--gpus", "sim:24576")
    doomed = start_cli(
        "run",
        "synthetic",
        "--study",
        "kill",
        "--trials",
        "4",
        "--concurrency",
        "1",
        "--option",
        "trial_seconds=6",
        "--epochs",
        "3",
        "--pruner",
        "none",
        *common,
    )

    def running_trial():
        try:
            trials = _study(postgres_url, "kill").get_trials(states=(TrialState.RUNNING,))
        except KeyError:
            return None
        # Mid-training: every parameter drawn, the objective running.
        return next((t for t in trials if len(t.params) == 5), None)

    victim = wait_for(running_trial, "a running trial", every=0.5)
    os.killpg(doomed.pid, signal.SIGKILL)  # the worker and its trial process, mid-trial
    doomed.wait()

    survivor = run_cli(
        "worker", "--study", "kill", "--concurrency", "2", *common, timeout=400, env=cli_env()
    )
    # The survivor waits out the grace period, fails the lost trial, and re-runs its parameters.
    assert survivor.returncode == 0, survivor.stderr
    study = _study(postgres_url, "kill")
    count = count_trials(study.trials)
    assert count.counted == 4 and count.running == 0
    lost = study.trials[victim.number]
    assert lost.state == TrialState.FAIL
    rerun = [t for t in study.trials if t.system_attrs.get("retry_history") == [victim.number]]
    assert len(rerun) == 1 and rerun[0].state == TrialState.COMPLETE
    assert rerun[0].params == lost.params


def test_two_workers_with_different_gpus_share_one_postgres_study_exactly(postgres_url, tmp_path):
    # 5 MB per sample: a 24 GB GPU's bound stays low, an 80 GB GPU's goes higher.
    # The first host's trials end only once the second host has claimed one (more than the first
    # host's 2 running), so both hosts train however slowly the second one starts.
    release = tmp_path / "release"
    options = ("--option", "trial_seconds=2", "--option", "per_sample_mb=5")
    options += ("--option", f"release={release}")
    common = ("--storage", postgres_url, "--concurrency", "2")
    first = start_cli(
        "run",
        "--adapter-path",
        "tests.gated_adapter:adapter",
        "--study",
        "pair",
        "--trials",
        "10",
        "--epochs",
        "2",
        "--pruner",
        "none",
        "--gpus",
        "sim:24576",
        *options,
        *common,
    )
    wait_for(lambda: _has_study(postgres_url, "pair"), "the study", every=0.5)
    second = start_cli("worker", "--study", "pair", "--gpus", "sim:81920", *common)
    wait_for(lambda: _running(postgres_url, "pair") > 2, "3 running trials", timeout=300, every=0.5)
    release.touch()
    second_out, second_err = second.communicate(timeout=400)
    out, err = first.communicate(timeout=400)
    assert first.returncode == 0, err
    assert second.returncode == 0, second_err

    study, _ = _assert_every_trial_recorded(postgres_url, "pair")
    count = count_trials(study.trials)
    assert count.counted == 10 and count.complete == 10  # exact: no overshoot from races
    by_gpu = {}
    for trial in study.trials:
        by_gpu.setdefault(trial.user_attrs["gpu"], []).append(trial)
        low, high = trial.user_attrs["batch_bounds"]
        assert low <= trial.params["batch_size"] <= high
    assert set(by_gpu) == {"Simulated GPU 24 GB", "Simulated GPU 80 GB"}
    bounds = {gpu: tuple(trials[0].user_attrs["batch_bounds"]) for gpu, trials in by_gpu.items()}
    assert bounds["Simulated GPU 24 GB"][1] < bounds["Simulated GPU 80 GB"][1]


def _running(url, name):
    return sum(t.state == TrialState.RUNNING for t in _study(url, name).trials)


def _has_study(url, name):
    try:
        return bool(_study(url, name).user_attrs.get("orchestrator"))
    except KeyError:
        return False


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_sigterm_lets_the_grace_period_pass_then_stops_and_re_queues(sqlite_url):
    worker = start_cli(
        "run",
        "synthetic",
        "--study",
        "stop",
        "--trials",
        "3",
        "--concurrency",
        "1",
        "--gpus",
        "sim:24576",
        "--grace",
        "1",
        "--option",
        "trial_seconds=60",
        "--storage",
        sqlite_url,
    )
    # Opened as the CLI opens it, under the schema lock: a plain `optuna.load_study` here would
    # create the database's tables at the moment the CLI does, and one of the two would fail.
    storage = open_storage(StorageLocation.parse(sqlite_url))

    def training():
        try:
            study = optuna.load_study(study_name="stop", storage=storage)
        except KeyError:
            return None
        trials = study.get_trials(states=(TrialState.RUNNING,))
        return next((t for t in trials if len(t.params) == 5), None)

    victim = wait_for(training, "a training trial", every=0.5)
    worker.send_signal(signal.SIGTERM)  # the supervisor only, as `kill PID` or Kubernetes would
    worker.communicate(timeout=patient(60))
    assert worker.returncode == 143  # as a shell reports a process stopped by SIGTERM
    study = optuna.load_study(study_name="stop", storage=storage)
    stopped = study.trials[victim.number]
    assert stopped.state == TrialState.FAIL
    assert "stopped by signal" in stopped.user_attrs["error"]
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert len(queued) == 1 and queued[0].system_attrs["retry_history"] == [victim.number]
    assert not study.get_trials(states=(TrialState.RUNNING,))


def test_workers_that_start_together_on_an_empty_database_share_one_exact_budget(postgres_url):
    # As Kubernetes pods do: every one runs `run`, none waits for another to create anything.
    workers = [
        start_cli(
            "run",
            "synthetic",
            "--study",
            "crowd",
            "--trials",
            "8",
            "--concurrency",
            "1",
            "--gpus",
            "sim:24576",
            "--option",
            "trial_seconds=1",
            "--storage",
            postgres_url,
        )
        for _ in range(3)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
    count = count_trials(_study(postgres_url, "crowd").trials)
    assert count.counted == 8 and count.running == 0 and count.waiting == 0


def test_timeout_starts_nothing_new_and_lets_running_trials_finish(sqlite_url):
    done = run_cli(
        "run",
        "synthetic",
        "--trials",
        "6",
        "--concurrency",
        "1",
        "--gpus",
        "sim:24576",
        # The first trial must start before the timeout: a trial process's start takes 10 s
        # and more on a loaded machine, so the timeout leaves room for it. A trial longer than
        # the timeout is still running when it passes, however soon it started.
        "--timeout",
        "20",
        "--grace",
        "0",
        "--option",
        "trial_seconds=21",
        "--epochs",
        "2",
        "--pruner",
        "none",
        "--storage",
        sqlite_url,
    )
    assert done.returncode == 0, done.stderr  # a timeout is an ordinary end, not an interruption
    states = [t.state for t in _study(sqlite_url, "synthetic").trials]
    assert states == [TrialState.COMPLETE]  # the one running trial finished, none began after


def test_a_worker_stops_when_trial_processes_cannot_start(sqlite_url):
    from orchestrator.run.pool.trial_endings import TrialsCannotStart

    storage = open_storage(StorageLocation.parse(sqlite_url), heartbeat=True)
    study = optuna.create_study(study_name="broken", storage=storage)
    spec = StudySpec(adapter="no_such_adapter", trials=3, epochs=1, direction="minimize")
    save_spec(study, spec)
    from adapters.base import MemoryModel

    plan = plan_node([], MemoryModel(1.0, 0.0), cpu_bound=False, cpu_cores=2)
    pool = Pool.on_storage(
        storage_location=StorageLocation.parse(sqlite_url),
        engine=storage.engine,
        study=study,
        spec=spec,
        plans=list(plan.gpus),
        probe=SimProbe([]),
        cpu_cores=2,
    )
    with pytest.raises(TrialsCannotStart, match="unknown adapter 'no_such_adapter'"):
        pool.run()
    assert study.trials == []
