"""The Slurm batch script as text and run by bash, and `slurm`'s bad input: no cluster needed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.deploy.slurm import SIM_GPU_ENV, SlurmJob, sbatch_script
from orchestrator.errors import UserError
from orchestrator.planning.workloads import WORKLOADS_ENV, parse_quantity, workload_class
from orchestrator.record.store.location import STORAGE_ENV
from tests.cli_helpers import cli_env, run_cli
from tests.waiting import patient

SECRET = "postgresql://orch:s3cr3t-pw@db.example:5432/studies"


@pytest.fixture(autouse=True)
def _no_user_overrides(monkeypatch) -> None:
    monkeypatch.delenv(WORKLOADS_ENV, raising=False)


def job(**values) -> SlurmJob:
    base = {
        "study": "syn",
        "workload": workload_class("supervised"),
        "nodes": 3,
        "gpus_per_node": 4,
    }
    return SlurmJob(**{**base, **values})


def sbatch_lines(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        match = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(.*))?", line)
        if match:
            found[match[1]] = match[2] or ""
    return found


@pytest.mark.parametrize("class_name", ["rl", "supervised"])
def test_the_array_asks_each_node_for_its_gpus_and_the_class_cpu_and_memory(class_name) -> None:
    wc = workload_class(class_name)
    lines = sbatch_lines(sbatch_script(job(workload=wc, nodes=3, gpus_per_node=4)))
    assert lines["array"] == "0-2"  # one task per node
    assert lines["nodes"] == "1"
    assert lines["gres"] == "gpu:4"
    assert "exclusive" in lines  # never two tasks on one node, whatever its GPU count
    assert "requeue" in lines
    # The same table as the Kubernetes manifests: CPU request rounded up, memory request (the
    # limit, 40 GiB a GPU for supervised, is more than a node of 8 GPUs often has).
    assert int(lines["cpus-per-gpu"]) >= parse_quantity(wc.cpu_request)
    assert int(lines["cpus-per-gpu"]) - 1 < parse_quantity(wc.cpu_request)
    assert int(lines["mem-per-gpu"].removesuffix("M")) * 2**20 == parse_quantity(wc.memory_request)
    assert int(lines["mem-per-gpu"].removesuffix("M")) < 40960
    assert "partition" not in lines and "time" not in lines and "account" not in lines


def test_partition_time_and_account_are_passed_when_given() -> None:
    lines = sbatch_lines(
        sbatch_script(job(partition="gpu,gpu-long", time="1-12:00:00", account="ml-lab"))
    )
    assert (lines["partition"], lines["time"], lines["account"]) == (
        "gpu,gpu-long",
        "1-12:00:00",
        "ml-lab",
    )


def test_the_task_runs_worker_or_run_with_a_quoted_study_name() -> None:
    joined = sbatch_script(job(study="my study; rm -rf /"))
    assert "worker --study 'my study; rm -rf /' --gpus \"$gpus\"" in joined
    created = sbatch_script(job(adapter="synthetic", trials=12))
    assert 'run synthetic --study syn --trials 12 --gpus "$gpus"' in created
    assert (
        "bash: "
        not in subprocess.run(["bash", "-n"], input=joined, text=True, capture_output=True).stderr
    )


def fake_python(tmp_path, status: int = 0):
    """An interpreter stand-in that prints the arguments and environment the task gives it."""
    stub = tmp_path / "python"
    stub.write_text(
        f'#!/bin/bash\necho "ARGS $*"\necho "STORAGE ${{{STORAGE_ENV}:-}}"\n'
        f'echo "CVD ${{CUDA_VISIBLE_DEVICES:-}}"\nexit {status}\n'
    )
    stub.chmod(0o755)
    return str(stub)


def run_script(tmp_path, script: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "41", "SLURMD_NODENAME": "n1", **env}
    return subprocess.run(
        ["bash", "-c", script], text=True, capture_output=True, env=environ, timeout=patient(30)
    )


def test_the_task_takes_slurms_gpus_and_the_storage_from_the_environment(tmp_path) -> None:
    script = sbatch_script(job(python=fake_python(tmp_path)))
    assert SECRET not in script and "s3cr3t" not in script
    real = run_script(tmp_path, script, CUDA_VISIBLE_DEVICES="2,3", **{STORAGE_ENV: SECRET})
    assert real.returncode == 0, real.stderr
    assert "ARGS -m orchestrator worker --study syn --gpus auto" in real.stdout
    # An exclusive task is allotted every GPU of its node: the worker keeps the G it asked for.
    two = sbatch_script(job(python=fake_python(tmp_path), gpus_per_node=2))
    whole_node = run_script(tmp_path, two, CUDA_VISIBLE_DEVICES="0,1,2,3", **{STORAGE_ENV: SECRET})
    assert "CVD 0,1\n" in whole_node.stdout, whole_node.stdout
    assert f"STORAGE {SECRET}" in real.stdout  # from the environment, never the script
    assert "worker exited with status 0" in real.stdout
    # Simulated devices stand in for the allotted GPUs: one per index Slurm gave.
    sim = run_script(
        tmp_path,
        script,
        CUDA_VISIBLE_DEVICES="2,3",
        **{STORAGE_ENV: SECRET, SIM_GPU_ENV: "4096"},
    )
    assert "--gpus sim:4096,sim:4096" in sim.stdout
    assert "GPUs 2,3" in sim.stdout


def test_a_task_without_the_storage_stops_at_once_and_a_failed_worker_fails_it(tmp_path) -> None:
    bare = run_script(tmp_path, sbatch_script(job(python=fake_python(tmp_path))))
    assert bare.returncode == 2
    assert f"{STORAGE_ENV} is not set" in bare.stderr
    assert "ARGS" not in bare.stdout
    failing = sbatch_script(job(python=fake_python(tmp_path, status=3)))
    failed = run_script(tmp_path, failing, **{STORAGE_ENV: SECRET})
    assert failed.returncode == 3
    assert "worker exited with status 3" in failed.stdout


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"nodes": 0}, "--nodes 0"),
        ({"gpus_per_node": 65}, "--gpus-per-node 65"),
        ({"time": "soon"}, "--time 'soon'"),
        ({"partition": "gpu; rm"}, "--partition"),
        ({"account": "a b"}, "--account"),
        ({"study": "  "}, "--study is empty"),
    ],
)
def test_a_job_that_cannot_be_submitted_is_refused_saying_what_to_give(values, says) -> None:
    with pytest.raises(UserError, match=re.escape(says)):
        job(**values)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nodes", "2", "--gpus-per-node", "2"], "name what to run"),
        (["synthetic", "--nodes", "0", "--gpus-per-node", "2"], "--nodes 0 must be at least 1"),
        (["synthetic", "--nodes", "2"], "--gpus-per-node"),
        (["synthetic", "--nodes", "2", "--gpus-per-node", "x"], "not a whole number"),
        (["synthetic", "--nodes", "2", "--gpus-per-node", "2", "--time", "1h"], "--time '1h'"),
        (["nosuch", "--nodes", "2", "--gpus-per-node", "2", "--dry-run"], "unknown adapter"),
        (
            ["--study", "syn", "--nodes", "1", "--gpus-per-node", "1", "--trials", "3"],
            "--trials is a study setting: give the ADAPTER too",
        ),
        (
            ["--study", "syn", "--nodes", "1", "--gpus-per-node", "1", "--artifacts", "/x"],
            "--artifacts is a study setting: give the ADAPTER too",
        ),
        (
            ["--study", "syn", "--nodes", "1", "--gpus-per-node", "1", "--seed", "0"],
            "--seed is a study setting: give the ADAPTER too",
        ),
        (
            ["--study", "syn", "--nodes", "1", "--gpus-per-node", "1", "--checkpoint-every", "0"],
            "--checkpoint-every is a study setting: give the ADAPTER too",
        ),
        (
            ["synthetic", "--nodes", "1", "--gpus-per-node", "1", "--epochs", "0"],
            "--epochs 0 must be at least 1",
        ),
        (
            ["synthetic", "--nodes", "1", "--gpus-per-node", "1", "--option", "nosuch=1"],
            "nosuch",
        ),
        (
            ["--study", "nosuch", "--nodes", "1", "--gpus-per-node", "1", "--dry-run"],
            "no storage for the nodes",
        ),
        (
            [
                "synthetic",
                "--nodes",
                "1",
                "--gpus-per-node",
                "1",
                "--dry-run",
                "--storage",
                "sqlite:///x.db",
            ],
            "--storage is an SQLite file: workers on several nodes need a database server",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, says, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no orchestrator.db here
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert main(["slurm", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err
    assert len(err.splitlines()) == 1


def test_submitting_needs_a_database_server_in_the_environment(tmp_path) -> None:
    args = ["slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1"]
    unset = run_cli(*args, cwd=tmp_path)
    assert unset.returncode == 2
    assert "no storage for the nodes: give --storage" in unset.stderr
    on_sqlite = run_cli(*args, cwd=tmp_path, env=cli_env(**{STORAGE_ENV: "sqlite:///x.db"}))
    assert on_sqlite.returncode == 2
    assert "database server" in on_sqlite.stderr
    # Without Slurm installed, or with it, a password never reaches the output.
    no_sbatch = run_cli(
        *args, cwd=tmp_path, env=cli_env(**{STORAGE_ENV: SECRET, "PATH": str(tmp_path)})
    )
    assert no_sbatch.returncode == 2
    assert "sbatch is not on PATH" in no_sbatch.stderr
    assert "s3cr3t" not in no_sbatch.stdout + no_sbatch.stderr
    assert "Traceback" not in no_sbatch.stderr


@pytest.mark.postgres
def test_dry_run_prints_a_script_bash_accepts(tmp_path, postgres_url) -> None:
    url = with_password(postgres_url)
    done = run_cli(
        "slurm", "synthetic", "--nodes", "2", "--gpus-per-node", "2", "--dry-run",
        "--storage", url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "s3cr3t" not in done.stdout + done.stderr
    assert postgres_url.rpartition("/")[2] not in done.stdout  # the URL is never in the script
    assert done.stdout.startswith("#!/bin/bash\n")
    assert sbatch_lines(done.stdout)["gres"] == "gpu:2"
    assert subprocess.run(["bash", "-n"], input=done.stdout, text=True).returncode == 0


def test_a_task_stopped_by_sigterm_ends_0_once_its_worker_has_left(tmp_path) -> None:
    """Slurm signals every process of the task: the shell waits for the worker, which leaves 130
    (stopped by a signal, its trials re-queued), and the task ends 0 as scancel asked."""
    stub = tmp_path / "python"
    stub.write_text(
        "#!/bin/bash\n"
        "trap 'echo worker: re-queued; exit 143' TERM\n"
        "echo worker: running\n"
        "while true; do sleep 0.1; done\n"
    )
    stub.chmod(0o755)
    script = sbatch_script(job(python=str(stub)))
    environ = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "41", STORAGE_ENV: SECRET}
    task = subprocess.Popen(
        ["bash", "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env=environ,
        start_new_session=True,
    )
    assert task.stdout is not None
    assert "slurm job" in task.stdout.readline()
    assert task.stdout.readline().strip() == "worker: running"
    os.killpg(task.pid, signal.SIGTERM)  # as scancel does: every process of the job
    out, _ = task.communicate(timeout=patient(30))
    assert task.returncode == 0, out
    assert "SIGTERM received" in out
    assert "worker: re-queued" in out
    assert "worker exited with status 143" in out
    assert "the task ends with status 0" in out


def fake_sbatch(tmp_path, study: str = "") -> dict[str, str]:
    """An sbatch that keeps the script and the storage it was given, and prints job id 77; with a
    study, also the epochs stored with it at that moment (read by plain Optuna)."""
    read = (
        f'{sys.executable} -c "import optuna, os, json; s = optuna.load_study(study_name='
        f"'{study}', storage=os.environ['{STORAGE_ENV}']); print(s.user_attrs)\" "
        f'> "{tmp_path}/stored" 2>&1\n'
        if study
        else ""
    )
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(
        f'#!/bin/bash\ncat > "{tmp_path}/script"\n{read}'
        f'echo "${{{STORAGE_ENV}}}" > "{tmp_path}/storage"\necho 77\n'
    )
    sbatch.chmod(0o755)
    return cli_env(PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def with_password(url: str) -> str:
    """The test server's URL with a password in it (trust auth ignores it): never to be printed."""
    import sqlalchemy as sa

    return sa.engine.make_url(url).set(password="s3cr3t-pw").render_as_string(hide_password=False)


def stored_spec(url: str, name: str):
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.storage import create_storage
    from orchestrator.record.study.spec import load_spec

    storage = create_storage(StorageLocation.parse(url))
    try:
        import optuna

        return load_spec(optuna.load_study(study_name=name, storage=storage))
    except KeyError:
        return None
    finally:
        storage.engine.dispose()


SETTINGS = (
    "--trials", "7", "--epochs", "3", "--option", "trial_seconds=0.25", "--sampler", "random",
    "--seed", "11", "--pruner", "none", "--max-retries", "4", "--checkpoint-every", "2",
)  # fmt: skip


@pytest.mark.postgres
def test_the_study_is_stored_with_every_setting_before_sbatch_and_the_tasks_join_it(
    tmp_path, postgres_url
) -> None:
    """`slurm ADAPTER` takes run's study settings and stores them before it submits; the
    storage reaches sbatch in ORCHESTRATOR_STORAGE only, never the script or the output."""
    url = with_password(postgres_url)
    artifacts = tmp_path / "shared-ckpt"
    done = run_cli(
        "slurm", "synthetic", "--study", "syn-all", "--nodes", "2", "--gpus-per-node", "1",
        *SETTINGS, "--artifacts", str(artifacts), "--storage", url,
        cwd=tmp_path, env=fake_sbatch(tmp_path, study="syn-all"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "submitted Slurm job 77" in done.stdout
    assert "'epochs': 3" in (tmp_path / "stored").read_text()  # stored before sbatch ran
    assert "study 'syn-all' created" in done.stdout
    assert (tmp_path / "storage").read_text().strip() == url
    script = (tmp_path / "script").read_text()
    assert "s3cr3t" not in script and "s3cr3t" not in done.stdout + done.stderr
    assert 'worker --study syn-all --gpus "$gpus"' in script  # the settings come from the study
    spec = stored_spec(postgres_url, "syn-all")
    assert spec is not None
    assert (spec.adapter, spec.trials, spec.epochs, spec.sampler, spec.seed) == (
        "synthetic", 7, 3, "random", 11,
    )  # fmt: skip
    assert (spec.pruner, spec.max_retries, spec.checkpoint_every) == ("none", 4, 2)
    assert spec.options["trial_seconds"] == 0.25
    assert spec.artifacts == str(artifacts)


@pytest.mark.postgres
def test_a_dry_run_stores_nothing_and_a_changed_setting_is_refused_as_run_refuses_it(
    tmp_path, postgres_url
) -> None:
    args = ("slurm", "synthetic", "--study", "syn-d", "--nodes", "1", "--gpus-per-node", "1")
    dry = run_cli(*args, *SETTINGS, "--dry-run", "--storage", postgres_url, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "--dry-run stored nothing" in dry.stderr
    assert stored_spec(postgres_url, "syn-d") is None
    env = fake_sbatch(tmp_path)
    assert (
        run_cli(*args, *SETTINGS, "--storage", postgres_url, cwd=tmp_path, env=env).returncode == 0
    )
    (tmp_path / "script").unlink()
    changed = run_cli(*args, "--epochs", "5", "--storage", postgres_url, cwd=tmp_path, env=env)
    assert changed.returncode == 2
    assert "--update-settings" in changed.stderr and "Traceback" not in changed.stderr
    assert not (tmp_path / "script").exists()  # nothing submitted
    assert stored_spec(postgres_url, "syn-d").epochs == 3
    # What it was stored with, typed again, is no change: the study is resumed and submitted.
    again = run_cli(*args, "--epochs", "3", "--storage", postgres_url, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "study 'syn-d' resumed" in again.stdout


def test_the_slurm_engine_renders_the_batch_script_of_its_job() -> None:
    from orchestrator.deploy.engine import StudyWorkers
    from orchestrator.deploy.slurm import SlurmEngine

    engine = SlurmEngine(gpus_per_node=4, partition="gpu", python="/opt/py/bin/python")
    workers = StudyWorkers(
        study="syn", workers=3, workload=workload_class("supervised"), adapter="synthetic", epochs=2
    )
    files = engine.render(workers)
    expected = job(adapter="synthetic", epochs=2, partition="gpu", python="/opt/py/bin/python")
    assert files == {"orch-syn.sbatch": sbatch_script(expected)}
    assert 'run synthetic --study syn --epochs 2 --gpus "$gpus"' in files["orch-syn.sbatch"]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"trials": 3}, "give the ADAPTER too"),
        ({"epochs": 2}, "give the ADAPTER too"),
        ({"adapter": "synthetic", "epochs": 0}, "--epochs 0"),
    ],
)
def test_a_budget_or_epochs_without_an_adapter_is_refused(values, says) -> None:
    with pytest.raises(UserError, match=re.escape(says)):
        job(**values)
