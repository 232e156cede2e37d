"""A host process killed alone (the kernel's OOM killer, a crash in the host) while its trial
processes live on, with real processes: each running trial stops at once, is re-queued as a
preempted one is (its checkpoints kept, no failure counted), and the next `run` or `worker` of
the study resumes it from its last checkpoint. The trial processes and the fork server go
within seconds; each stopped trial's log says why in one line. A trial process frozen past the
heartbeat (SIGSTOP) and woken after its trial was taken over says so in one line too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from orchestrator.record.study.spec import count_trials
from tests.cli_helpers import cli_env, freeze, run_cli, start_cli
from tests.test_checkpoint_resume import EPOCHS, assert_resumed
from tests.waiting import stored_study, wait_for

TOLERATE = (KeyError, IndexError, optuna.exceptions.StorageInternalError)
GONE_WITHIN_S = 10.0  # from the host's death to the last of its processes gone
# A grace of 3 s (cli_env's) fails live trials as stale on a loaded machine (their heartbeat
# threads starve while a command starts beside them): these tests must see every re-run come
# from the host's death, not from a heartbeat that went stale.
ENV = cli_env(ORCHESTRATOR_GRACE_PERIOD="10")


def _session(sid: int) -> list[int]:
    """The live processes of session `sid` (the host started each test's command in its own)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _training(url: str, name: str, pids: set[int] | None = None) -> list[optuna.trial.FrozenTrial]:
    """Running trials (of processes in `pids`, if given) that saved at least two checkpoints."""
    trials = stored_study(url, name).get_trials(states=(TrialState.RUNNING,))
    return [
        t
        for t in trials
        if t.user_attrs.get("checkpoint", {}).get("epoch", -1) >= 1
        and (pids is None or t.user_attrs.get("pid") in pids)
    ]


def _kill_host_alone(host) -> float:
    """SIGKILL the host only; seconds until every process of its session is gone."""
    os.kill(host.pid, signal.SIGKILL)
    killed = time.monotonic()
    host.wait()
    wait_for(lambda: not _session(host.pid), "the host's processes to go", timeout=60, every=0.1)
    for stream in (host.stdout, host.stderr):
        stream.close()
    return time.monotonic() - killed


def _assert_stopped_and_resumed(url: str, name: str, stopped_numbers: list[int]) -> None:
    """Each stopped trial: FAIL and re-queued, its log one line saying why, no traceback; its
    re-run resumed from its checkpoint; no failure counted against the budget."""
    study = stored_study(url, name)
    count = count_trials(study.trials)
    assert (count.complete, count.failed, count.running, count.waiting) == (4, 0, 0, 0), count
    for number in stopped_numbers:
        stopped = study.trials[number]
        assert stopped.state == TrialState.FAIL, stopped
        reruns = [
            t for t in study.trials if t.system_attrs.get("retry_history", [])[-1:] == [number]
        ]
        assert len(reruns) == 1, [t.system_attrs for t in study.trials]
        assert reruns[0].user_attrs["retry_reason"] == "host gone"  # not found stale later
        assert assert_resumed(stopped, reruns[0]) >= 1
        log = Path(stopped.user_attrs["log_file"]).read_text()
        assert "Traceback" not in log, log
        assert log.count("stopped: its host process is gone") == 1, log  # said once, not per member
        assert "re-queued" in log and "checkpoint" in log, log


# 3 s an epoch: under load the trials' starts lie seconds apart, and each must have saved twice
# (6 s) while none has ended (18 s) when the host is killed.
def _run_args(url: str, *extra: str) -> tuple[str, ...]:
    return (
        "run", "synthetic", "--trials", "4", "--epochs", str(EPOCHS), "--option",
        "trial_seconds=18", "--pruner", "none", "--sampler", "random",
        "--gpus", "sim:24576", "--storage", url, *extra,
    )  # fmt: skip


# A process that trains (a sleep, armed for a stop) with its pipe's other end held by its parent:
# the parent closes it, as a dead host's end closes.
WATCHED = """
import multiprocessing.connection as mpc, sys, time
from orchestrator.run.trial.host import HostLink, name_process
from orchestrator.run.trial.signals import Interrupted, install_signal_handlers, interruptible
install_signal_handlers()
name_process("trial-12:a study named at length")
print(open("/proc/self/comm").read().strip(), flush=True)
link = HostLink(mpc.Connection(int(sys.argv[1])))
link.watch()
started = time.monotonic()
try:
    with interruptible():
        time.sleep(60)
except Interrupted as stop:
    print(stop, round(time.monotonic() - started, 1), flush=True)
link.send(("vram_peak_mb", 1.0))  # broken pipe: no error once the stop is taken
"""


def test_a_trial_process_stops_as_its_host_s_end_of_the_pipe_closes():
    host_end, trial_end = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", WATCHED, str(trial_end.fileno())],
        pass_fds=[trial_end.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    trial_end.close()
    assert child.stdout.readline().strip() == "trial-12:a_stud"  # 15 bytes, no space
    time.sleep(1)
    host_end.close()
    closed = time.monotonic()
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.startswith("its host process is gone"), (out, err)
    assert time.monotonic() - closed < 10, out
    assert "Traceback" not in err, err


def _four_training(url: str, args: tuple[str, ...], what: str):
    """The host that `args` starts, once four of its trials have saved twice; and those trials."""
    host = start_cli(*args, env=ENV)
    victims = wait_for(
        lambda: len(_training(url, "synthetic")) == 4 and _training(url, "synthetic"),
        what,
        timeout=240,
        tolerate=TOLERATE,
    )
    return host, victims


def _next_run_resumes(url: str, args: tuple[str, ...], victims: list) -> None:
    again = run_cli(*args, timeout=300, env=ENV)
    assert again.returncode == 0, again.stderr
    # The four stopped trials were failed and re-queued by their processes: the counts say so.
    done = "4/4 trials done (4 complete, 0 pruned, 0 failed; 4 failed and re-run)"
    assert done in again.stdout, again.stdout
    _assert_stopped_and_resumed(url, "synthetic", [t.number for t in victims])


def test_a_run_killed_alone_leaves_its_trials_to_the_next_run(sqlite_url):
    args = _run_args(sqlite_url, "--concurrency", "4")
    host, victims = _four_training(sqlite_url, args, "four trials with two checkpoints each")
    pids = [t.user_attrs["pid"] for t in victims]
    names = {_comm(pid) for pid in pids}
    assert names == {f"trial-{t.number}:synthetic"[:15] for t in victims}, names
    seconds = _kill_host_alone(host)
    assert seconds < GONE_WITHIN_S, f"the trial processes outlived their host by {seconds:.1f} s"
    _next_run_resumes(sqlite_url, args, victims)


def test_a_run_killed_alone_mid_group_leaves_each_member_to_the_next_run(sqlite_url):
    """A fused group (one process training four trials) under a host killed alone: every
    member stops at once and is re-queued as a single trial is, and the next run resumes each
    from its own checkpoint."""
    args = _run_args(sqlite_url, "--fuse", "4")
    host, victims = _four_training(sqlite_url, args, "a group of four with two checkpoints each")
    (pid,) = {t.user_attrs["pid"] for t in victims}  # one process holds the whole group
    assert all(len(t.user_attrs["fused_with"]) == 3 for t in victims), victims
    seconds = _kill_host_alone(host)
    assert seconds < GONE_WITHIN_S, f"the group's process outlived its host by {seconds:.1f} s"
    _next_run_resumes(sqlite_url, args, victims)


def test_a_worker_killed_alone_leaves_its_trials_to_the_study(postgres_url, tmp_path):
    # In tmp_path: a study on a database server keeps its trials' logs in the working folder.
    first = start_cli(
        *_run_args(postgres_url, "--artifacts", str(tmp_path / "ckpt"), "--concurrency", "2"),
        cwd=tmp_path,
        env=ENV,
    )
    wait_for(lambda: stored_study(postgres_url, "synthetic"), "the study", tolerate=TOLERATE)
    worker = (
        "worker", "--study", "synthetic", "--storage", postgres_url, "--gpus", "sim:24576",
        "--concurrency", "2",
    )  # fmt: skip
    doomed = start_cli(*worker, cwd=tmp_path, env=ENV)

    def worker_training():
        ours = set(_session(doomed.pid))
        trials = _training(postgres_url, "synthetic", ours)
        return len(trials) == 2 and trials

    victims = wait_for(worker_training, "the worker's two trials saving", timeout=240)
    seconds = _kill_host_alone(doomed)
    assert seconds < GONE_WITHIN_S, f"the trial processes outlived their host by {seconds:.1f} s"

    again = run_cli(*worker, cwd=tmp_path, timeout=300, env=ENV)
    out, err = first.communicate(timeout=300)
    assert again.returncode == 0, again.stderr
    assert first.returncode == 0, err
    _assert_stopped_and_resumed(postgres_url, "synthetic", [t.number for t in victims])


def test_a_trial_woken_after_it_was_taken_over_says_so_in_one_line(sqlite_url):
    # 2 s an epoch: frozen once it has reported its first, 10 s before it would end.
    runner = start_cli(
        "run", "synthetic", "--trials", "1", "--epochs", str(EPOCHS), "--option",
        "trial_seconds=12", "--concurrency", "1", "--pruner", "none", "--sampler", "random",
        "--gpus", "sim:24576", "--storage", sqlite_url,
    )  # fmt: skip

    def training():
        trial = stored_study(sqlite_url, "synthetic").trials[0]
        return trial if trial.intermediate_values else None

    frozen = wait_for(training, "trial 0 training", timeout=240, tolerate=TOLERATE)
    pid = frozen.user_attrs["pid"]
    freeze(pid)
    wait_for(
        lambda: len(stored_study(sqlite_url, "synthetic").trials) > 1,
        "its re-run",
        timeout=120,
        tolerate=TOLERATE,
    )
    os.kill(pid, signal.SIGCONT)
    _, stderr = runner.communicate(timeout=300)
    assert runner.returncode == 0, stderr
    log = Path(frozen.user_attrs["log_file"]).read_text()
    assert "Traceback" not in log and "UpdateFinishedTrialError" not in log, log
    assert log.count("was taken over while this process was frozen") == 1, log
