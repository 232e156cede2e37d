"""Faults tried on a real study, and what is left afterwards: the table of docs/reliability.md.

    python benchmarks/faults.py [--only NAME] [--out benchmarks/results/faults.json]

Each fault runs `run synthetic` for real (simulated GPU, 12 trials of 2 s, 3 at once, heartbeat
1 s, grace 3 s) on an SQLite file or on a PostgreSQL cluster of its own, does the damage, then
resumes where a user would, and counts the trials in the storage. It prints a Markdown table:
what the user saw (exit status, the lines that said something went wrong) and the counts.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRIALS = 12
RUN = [
    "run", "synthetic", "--trials", str(TRIALS), "--option", "trial_seconds=2", "--epochs", "4",
    "--gpus", "sim:24576", "--concurrency", "3", "--pruner", "none", "--grace", "1",
]  # fmt: skip
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "PYTHONUNBUFFERED": "1",
    "ORCHESTRATOR_HEARTBEAT_INTERVAL": "1",
    "ORCHESTRATOR_GRACE_PERIOD": "3",
}
ENV.pop("ORCHESTRATOR_STORAGE", None)


@dataclass
class Result:
    fault: str
    exit_statuses: list[int] = field(default_factory=list)
    said: list[str] = field(default_factory=list)  # lines about what went wrong
    complete: int = 0
    failed: int = 0
    re_run: int = 0  # failed and re-queued: not counted
    running: int = 0
    waiting: int = 0
    seconds: float = 0.0


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen, result: Result, timeout: float = 600) -> None:
    out, err = process.communicate(timeout=timeout)
    result.exit_statuses.append(process.returncode)
    for line in err.splitlines():
        if any(word in line for word in ("WARNING", "error", "Traceback", "went away", "is back")):
            # Without the clock: the same line from two runs reads the same.
            result.said.append(line[9:] if line[:2].isdigit() and line[8:9] == " " else line)
    result.said += [line for line in out.splitlines() if line.startswith("study ")]


def trial_processes(pid: int) -> list[int]:
    """The trial processes of a supervisor: its `spawn`ed children (not the resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == pid and b"spawn_main" in command:
                found.append(int(entry.name))
    return found


def _training(pid: int) -> bool:
    # The synthetic trial sleeps through its epochs; an idle process waits on its pipe.
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def count(url: str, result: Result) -> None:
    import optuna

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.study.spec import count_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(
        study_name="synthetic", storage=StorageLocation.parse(url).url
    ).trials
    counted = count_trials(trials)
    result.complete, result.failed = counted.complete, counted.failed
    result.re_run, result.running, result.waiting = (
        counted.retried,
        counted.running,
        counted.waiting,
    )


def wait_for_complete(url: str, number: int, timeout: float = 120) -> None:
    import sqlalchemy as sa

    from orchestrator.record.store.location import StorageLocation

    engine = sa.create_engine(StorageLocation.parse(url).url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                with engine.connect() as conn:
                    done = conn.execute(
                        sa.text("SELECT count(*) FROM trials WHERE state = 'COMPLETE'")
                    ).scalar()
                if done >= number:
                    return
            except sa.exc.SQLAlchemyError:
                pass
            time.sleep(0.3)
    finally:
        engine.dispose()
    raise RuntimeError(f"fewer than {number} trials completed in {timeout} s")


# --- the faults ------------------------------------------------------------------------------


def killed_trial_process(folder: Path, url: str, result: Result) -> None:
    """SIGKILL one trial process while its trial trains."""
    runner = start([*RUN, "--storage", url], folder)
    wait_for_complete(url, 2)
    victim = next(pid for pid in trial_processes(runner.pid) if _training(pid))
    os.kill(victim, signal.SIGKILL)
    finish(runner, result)


def killed_node(folder: Path, url: str, result: Result) -> None:
    """SIGKILL the whole node (supervisor and trial processes), then `run` again to resume."""
    runner = start([*RUN, "--storage", url], folder)
    wait_for_complete(url, 3)
    os.killpg(runner.pid, signal.SIGKILL)
    finish(runner, result)
    finish(start([*RUN, "--storage", url], folder), result)


def interrupted(folder: Path, url: str, result: Result) -> None:
    """Ctrl-C (SIGINT to the foreground process group), then `run` again to resume."""
    runner = start([*RUN, "--storage", url], folder)
    wait_for_complete(url, 3)
    os.killpg(runner.pid, signal.SIGINT)
    finish(runner, result)
    finish(start([*RUN, "--storage", url], folder), result)


def one_sqlite_file(folder: Path, url: str, result: Result) -> None:
    """`run` and two `worker`s on one SQLite file at once."""
    runner = start([*RUN, "--storage", url], folder)
    wait_for_complete(url, 0)
    workers = [
        start(
            [
                "worker",
                "--study",
                "synthetic",
                "--storage",
                url,
                "--gpus",
                "sim:24576",
                "--concurrency",
                "3",
            ],
            folder,
        )  # fmt: skip
        for _ in range(2)
    ]
    for process in [runner, *workers]:
        finish(process, result)


def postgres_restart(folder: Path, url: str, result: Result, *, down_s: float = 3.0) -> None:
    """PostgreSQL stopped (fast) for `down_s` seconds mid-study, then started."""
    cluster = result.cluster  # type: ignore[attr-defined]
    runner = start([*RUN, "--storage", url], folder)
    wait_for_complete(url, 3)
    cluster.stop()
    time.sleep(down_s)
    cluster.start()
    finish(runner, result)


def postgres_long_stop(folder: Path, url: str, result: Result) -> None:
    """PostgreSQL away for 8 s: longer than the heartbeat interval and the grace period."""
    postgres_restart(folder, url, result, down_s=8.0)


FAULTS: dict[str, tuple[str, Callable[..., None], str]] = {
    "postgres-restart": ("PostgreSQL restart (3 s down)", postgres_restart, "postgres"),
    "postgres-stop": (
        "PostgreSQL stopped 8 s (past the heartbeat)",
        postgres_long_stop,
        "postgres",
    ),
    "kill-trial": ("SIGKILLed trial process", killed_trial_process, "sqlite"),
    "kill-node": ("SIGKILLed node, then `run` again", killed_node, "sqlite"),
    "sigint": ("Ctrl-C (SIGINT), then `run` again", interrupted, "sqlite"),
    "one-sqlite-file": ("`run` + 2 `worker`s on one SQLite file", one_sqlite_file, "sqlite"),
}


def try_fault(name: str) -> Result:
    title, action, backend = FAULTS[name]
    result = Result(title)
    with tempfile.TemporaryDirectory(prefix="orchestrator-fault-") as folder:
        started = time.monotonic()
        if backend == "sqlite":
            url = f"sqlite:///{folder}/study.db"
            action(Path(folder), url, result)
            count(url, result)
        else:
            from tests.pg_cluster import PgCluster

            with PgCluster.create() as cluster:
                url = cluster.create_database("faults")
                result.cluster = cluster  # type: ignore[attr-defined]
                action(Path(folder), url, result)
                del result.cluster  # type: ignore[attr-defined]
                count(url, result)
        result.seconds = round(time.monotonic() - started, 1)
    return result


def table(results: list[Result]) -> str:
    rows = [
        "| fault | exit status | what the user saw | complete | failed (final) | re-run | running |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        said = "<br>".join(f"`{line}`" for line in r.said) or "-"
        statuses = ", then ".join(str(code) for code in r.exit_statuses)
        rows.append(
            f"| {r.fault} | {statuses} | {said} | {r.complete}/{TRIALS} | {r.failed} | "
            f"{r.re_run} | {r.running} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=FAULTS, action="append")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "faults.json"))
    args = parser.parse_args()
    results = [try_fault(name) for name in args.only or FAULTS]
    print(table(results))
    Path(args.out).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
