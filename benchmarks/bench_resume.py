"""Epochs trained against the minimum when trials are interrupted, with and without checkpoints.

    python benchmarks/bench_resume.py [--out benchmarks/results/resume.json]

A real `run` (trial processes on a simulated 24 GB GPU, an SQLite file, 4 trials at once) of 20
trials of 10 epochs of the synthetic adapter (0.5 s an epoch), no pruner, meets three kinds of
interruption:

- kill -9 of one trial process, mid-trial (its heartbeat goes stale and it is re-run);
- an out-of-memory error at epoch 4 of the one trial queued with a batch of 4096 (the pool
  re-queues it alone with a smaller batch; tests/checkpoint_adapter.py raises torch's CUDA OOM);
- a preemption: SIGTERM to the worker, as Slurm's `scancel` or a preempting job sends it to
  every process of the job (the Slurm path itself is tested on a real cluster in
  tests/test_slurm_cluster.py): every trial in flight is stopped and re-queued, and `run` is
  started again to finish the study.

For `--checkpoint-every` 1, 2 and none it counts the epochs the trials trained (each trial's own
reports; epochs carried over from a checkpoint are not trained again), against the minimum of
20 x 10 (complete trials x 10), and for each interrupted trial the finished epochs lost: the last
epoch it reported minus the epoch its re-run went on from (a re-run stopped before it trained
hands on to its own re-run). The target, at most one checkpoint interval of N epochs lost per
interruption, is N - 1 finished epochs plus the epoch in progress when the trial was cut, which
is lost in every setting and not counted here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRIALS, EPOCHS, CONCURRENCY = 20, 10, 4
EPOCH_SECONDS = 0.5
OOM_EPOCH = 4
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "PYTHONUNBUFFERED": "1",
    "ORCHESTRATOR_HEARTBEAT_INTERVAL": "1",
    "ORCHESTRATOR_GRACE_PERIOD": "3",
}
ENV.pop("ORCHESTRATOR_STORAGE", None)
FIRST = "x: 1.0\ny: -2.0\nlearning_rate: 0.001\nbatch_size: 4096\nactivation: gelu\n"


def command(url: str, every: str, first: Path) -> list[str]:
    return [
        sys.executable, "-m", "orchestrator", "run", "--adapter-path",
        "tests.checkpoint_adapter:adapter", "--study", "resume", "--storage", url,
        "--trials", str(TRIALS), "--epochs", str(EPOCHS), "--concurrency", str(CONCURRENCY),
        "--option", f"trial_seconds={EPOCH_SECONDS * EPOCHS}", "--option", f"oom_epoch={OOM_EPOCH}",
        "--option", "oom_batch_above=4000", "--enqueue", str(first), "--gpus", "sim:24576",
        "--pruner", "none", "--sampler", "random", "--seed", "1", "--grace", "1",
        "--checkpoint-every", every, "-q",
    ]  # fmt: skip


def trials(url: str) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name="resume", storage=url).get_trials()
    except (KeyError, optuna.exceptions.StorageInternalError):
        return []


def wait_for(check, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError("timed out")


def mid_trial(url: str, exclude: set[int], past: int = 4):
    """A running trial past epoch `past`, not the OOM one nor one hit already."""

    def find():
        for trial in trials(url):
            if trial.state.name != "RUNNING" or trial.number in exclude:
                continue
            if trial.params.get("batch_size") == 4096 or "retry_of" in trial.user_attrs:
                continue
            if len(trial.intermediate_values) >= past:
                return trial
        return None

    return wait_for(find)


def one_setting(every: str, folder: Path) -> dict:
    url = f"sqlite:///{folder}/resume.db"
    first = folder / "first.yaml"
    first.write_text(FIRST)
    started = time.perf_counter()
    runner = subprocess.Popen(command(url, every, first), env=ENV, cwd=folder, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    killed = mid_trial(url, set())
    os.kill(killed.user_attrs["pid"], signal.SIGKILL)
    wait_for(lambda: any(t.user_attrs.get("oom") for t in trials(url)))  # the OOM came first
    preempted_at = mid_trial(url, {killed.number}, past=2)  # and the trials beside it
    runner.send_signal(signal.SIGTERM)  # the worker: its trials in flight stop and re-queue
    _, stderr = runner.communicate(timeout=600)
    if runner.returncode not in (0, 130):
        raise RuntimeError(f"run ended {runner.returncode}: {stderr[-2000:]}")
    again = subprocess.run(command(url, every, first), env=ENV, cwd=folder, text=True,
                           capture_output=True, timeout=900)  # fmt: skip
    if again.returncode != 0:
        raise RuntimeError(f"the resumed run ended {again.returncode}: {again.stderr[-2000:]}")
    seconds = time.perf_counter() - started
    return measure(trials(url), every, seconds, killed.number, preempted_at.number)


def measure(done: list, every: str, seconds: float, killed: int, preempted: int) -> dict:
    """Epochs each trial trained itself, and for each re-run what its stopped trial lost."""
    trained = 0
    for trial in done:
        carried = trial.user_attrs.get("resumed_from_epoch", -1) + 1
        trained += len(trial.intermediate_values) - carried
    lost: dict[str, list[int]] = {"kill -9": [], "OOM re-queue": [], "preemption": []}
    rerun_of = {t.user_attrs["retry_of"]: t for t in done if "retry_of" in t.user_attrs}
    for stopped in done:
        reached = max(stopped.intermediate_values, default=-1)
        if stopped.number not in rerun_of or reached < 0:
            continue  # not re-run, or stopped before it trained (waiting for its GPU)
        first = went = rerun_of[stopped.number]
        while not went.intermediate_values and went.number in rerun_of:
            went = rerun_of[went.number]  # its re-run was stopped before training in turn
        kind = {"lost": "kill -9", "oom": "OOM re-queue"}.get(
            first.user_attrs.get("retry_reason"), "preemption"
        )
        lost[kind].append(reached - went.user_attrs.get("resumed_from_epoch", -1))
    complete = sum(t.state.name == "COMPLETE" for t in done)
    final_failures = [
        t.number
        for t in done
        if t.state.name == "FAIL"
        and not any(r.user_attrs.get("retry_of") == t.number for r in done)
    ]
    return {
        "checkpoint_every": every,
        "complete": complete,
        "failed_for_good": final_failures,
        "epochs_trained": trained,
        "minimum": complete * EPOCHS,
        "extra": trained - complete * EPOCHS,
        "lost": lost,
        "seconds": round(seconds, 1),
        "killed_trial": killed,
        "preempted_first_seen": preempted,
    }


def remeasured(kept: Path, results: Path) -> list[dict]:
    """The kept studies measured again (the run's seconds and victims from its results)."""
    before = {r["checkpoint_every"]: r for r in json.loads(results.read_text())}
    rows = []
    for every, row in before.items():
        done = trials(f"sqlite:///{kept}/every-{every}/resume.db")
        rows.append(
            measure(done, every, row["seconds"], row["killed_trial"], row["preempted_first_seen"])
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| --checkpoint-every | trials complete | epochs trained | minimum | extra | "
        "finished epochs lost per interrupted trial: kill -9 / OOM / preemption | worst | "
        "target: within one interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lost = row["lost"]
        every = row["checkpoint_every"]
        worst = max((n for kind in lost.values() for n in kind), default=0)
        target = "-" if every == "none" else f"<= {int(every) - 1} + the epoch in progress"
        met = "" if every == "none" else " (met)" if worst <= int(every) - 1 else " (missed)"
        shown = " / ".join(",".join(map(str, lost[k])) or "-" for k in lost)
        lines.append(
            f"| {every} | {row['complete']} | {row['epochs_trained']} | {row['minimum']} | "
            f"{row['extra']} | {shown} | {worst} | {target}{met} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/resume.json"))
    parser.add_argument("--only", choices=("1", "2", "none"), action="append")
    parser.add_argument("--keep", metavar="DIR", help="keep each setting's study under DIR")
    parser.add_argument(
        "--measure", metavar="DIR", help="only measure the studies a run with --keep DIR kept"
    )
    args = parser.parse_args()
    if args.measure:
        rows = remeasured(Path(args.measure), Path(args.out))
        print(table(rows))
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
        return
    rows = []
    for every in args.only or ("1", "2", "none"):
        if args.keep:
            folder = Path(args.keep) / f"every-{every}"
            folder.mkdir(parents=True, exist_ok=True)
            rows.append(one_setting(every, folder))
        else:
            with tempfile.TemporaryDirectory() as temporary:
                rows.append(one_setting(every, Path(temporary)))
        print(f"checkpoint-every {every}: {rows[-1]}", flush=True)
    print(table(rows))
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
