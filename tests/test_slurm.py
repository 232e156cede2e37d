"""The Slurm batch script as text and run by bash, and `slurm`'s bad input: no cluster needed."""

from __future__ import annotations

import os
import re
import signal
import subprocess

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
    assert "requeue" in lines
    # The same table as the Kubernetes manifests: CPU request rounded up, memory limit.
    assert int(lines["cpus-per-gpu"]) >= parse_quantity(wc.cpu_request)
    assert int(lines["cpus-per-gpu"]) - 1 < parse_quantity(wc.cpu_request)
    assert int(lines["mem-per-gpu"].removesuffix("M")) * 2**20 >= parse_quantity(wc.memory_limit)
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
        f'#!/bin/bash\necho "ARGS $*"\necho "STORAGE ${{{STORAGE_ENV}:-}}"\nexit {status}\n'
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
            "give the ADAPTER too",
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


def test_dry_run_prints_a_script_bash_accepts(tmp_path) -> None:
    done = run_cli(
        "slurm", "synthetic", "--nodes", "2", "--gpus-per-node", "2", "--dry-run",
        "--storage", SECRET,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "s3cr3t" not in done.stdout and "db.example" not in done.stdout  # never in the script
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


def test_storage_given_as_a_flag_reaches_sbatch_in_its_environment_only(tmp_path) -> None:
    """`slurm --storage URL` as every command takes it: sbatch gets it in ORCHESTRATOR_STORAGE
    (which it exports to the tasks), and neither the script nor the output holds it."""
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(
        f'#!/bin/bash\ncat > "{tmp_path}/script"\n'
        f'echo "${{{STORAGE_ENV}}}" > "{tmp_path}/storage"\necho 77\n'
    )
    sbatch.chmod(0o755)
    env = cli_env(PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    done = run_cli(
        "slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--storage", SECRET,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "submitted Slurm job 77" in done.stdout
    assert (tmp_path / "storage").read_text().strip() == SECRET
    assert "s3cr3t" not in (tmp_path / "script").read_text()
    assert "s3cr3t" not in done.stdout + done.stderr


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
