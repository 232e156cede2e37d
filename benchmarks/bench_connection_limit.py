"""A cluster on a PostgreSQL that takes few connections: does the study finish, exact, without stalls?

    python benchmarks/bench_connection_limit.py [--hosts 3] [--slots 8] [--trials 300]
        [--trial-seconds 0.2] [--max-connections 20] [--out benchmarks/results/connection_limit.json]
        [--logs FOLDER]

A PostgreSQL cluster of the benchmark's own (tests/pg_cluster.py) with `max_connections` set low.
The first host runs `run synthetic --trials N` (simulated GPU, `--slots` trials at once), the
others join with `worker --study synthetic`, each from a folder of its own, all on that server
with no PgBouncer in front. Each host is a real process with its real trial processes.

Measured: trials finished against the budget (complete, pruned and final failures; a re-run's
failed try is not counted), how many trials exist and how many are left RUNNING, each host's exit
status and whether it called the database "unreachable", the longest stall (the longest time
between two trial ends; the start-up, from the first host's start to the first trial end, is
shown apart: it is the hosts' and trial processes' imports, not a wait for the database), and
how many times the server refused a connection ("sorry, too many clients already" in its own log),
and every failed trial (its re-run, its error, its host and process, when it started and failed:
a healthy trial failed as lost shows as a failure with no error, re-run). Target: N/N, exit 0 on
every host, no trial re-run, no stall over 10 s. Prints a table and writes the results as JSON;
`--logs` keeps each host's whole output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "connection_limit.json"
STUDY = "synthetic"
STALL_TARGET_S = 10.0


@dataclass
class Outcome:
    hosts: int
    slots: int
    sampler: str | None
    budget: int
    max_connections: int
    trial_seconds: float
    finished: int = 0  # complete + pruned + final failures
    trials_stored: int = 0
    running_left: int = 0
    exit_statuses: list[int] = field(default_factory=list)
    said_unreachable: list[bool] = field(default_factory=list)
    longest_stall_s: float = 0.0  # the longest time between two trial ends
    first_end_s: float = 0.0  # from the first host's start to the first trial end (start-up)
    stall_began_s: float = 0.0  # when the longest stall began, from the first host's start
    stall_after: int = 0  # trials ended before the longest stall
    ends_s: list[float] = field(default_factory=list)  # each trial's end, from the start
    refused_connections: int = 0  # the server's "too many clients" refusals
    seconds: float = 0.0
    host_lines: list[list[str]] = field(default_factory=list)  # warnings and errors each host said
    re_runs: int = 0  # trials that re-run a failed one's parameters
    frozen: int = 0  # trial processes stopped past the grace period on purpose (`freeze`)
    failures: list[dict] = field(default_factory=list)  # each failed trial: why, where, when

    @property
    def met(self) -> bool:
        return (
            self.finished == self.budget
            and self.running_left == 0
            and all(code == 0 for code in self.exit_statuses)
            and self.re_runs == 0
            and self.longest_stall_s <= STALL_TARGET_S
        )


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("ORCHESTRATOR_STORAGE", None)
    return env


def _start(argv: list[str], folder: Path) -> subprocess.Popen[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=folder,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _study_exists(url: str) -> bool:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT count(*) FROM studies WHERE study_name = :name"), {"name": STUDY}
            ).scalar()
            return bool(found)
    except sa.exc.SQLAlchemyError:
        return False  # no tables yet, or the server refused this look: look again
    finally:
        engine.dispose()


def _count(url: str, outcome: Outcome, started_at: float) -> None:
    import optuna

    from orchestrator.record.study.spec import count_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=STUDY, storage=url).trials
    counted = count_trials(trials)
    outcome.finished = counted.complete + counted.pruned + counted.failed
    outcome.trials_stored = len(trials)
    outcome.running_left = counted.running
    outcome.re_runs = sum(1 for t in trials if t.system_attrs.get("retry_history"))
    outcome.failures = _failures(trials, started_at)
    ends = sorted(t.datetime_complete.timestamp() for t in trials if t.datetime_complete)
    if ends:
        outcome.first_end_s = round(ends[0] - started_at, 1)
        outcome.ends_s = [round(end - started_at, 2) for end in ends]
        gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)] or [0.0]
        outcome.longest_stall_s = round(max(gaps), 2)
        outcome.stall_after = gaps.index(max(gaps)) + 1
        outcome.stall_began_s = round(ends[outcome.stall_after - 1] - started_at, 1)


def _failures(trials: list, started_at: float) -> list[dict]:
    """Each failed trial: its re-run, why it failed, where it ran, when it started and failed."""
    rerun_of = {}
    for trial in trials:
        history = trial.system_attrs.get("retry_history")
        if history:
            rerun_of.setdefault(int(history[-1]), trial.number)

    def since(moment) -> float | None:
        return None if moment is None else round(moment.timestamp() - started_at, 2)

    return [
        {
            "number": t.number,
            "re_run_as": rerun_of.get(t.number),
            "error": t.user_attrs.get("error"),
            "host_pid": [t.user_attrs.get("host"), t.user_attrs.get("pid")],
            "started_s": since(t.datetime_start),
            "failed_s": since(t.datetime_complete),
        }
        for t in trials
        if t.state.name == "FAIL"
    ]


def _freeze(url: str, count: int, outcome: Outcome) -> None:
    """Stop `count` training trial processes at once past the grace period, then let them go
    (all at once: one after another, the study could end before the last is caught)."""
    import sqlalchemy as sa

    from orchestrator.record.store.storage import heartbeat_settings

    grace = heartbeat_settings()[1]
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    training = sa.text(
        "SELECT t.trial_id, p.value_json FROM trials t JOIN trial_user_attributes p "
        "ON p.trial_id = t.trial_id AND p.key = 'pid' WHERE t.state = 'RUNNING' "
        "AND EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id "
        "AND a.key = 'admitted_at') ORDER BY t.number LIMIT :count"
    )
    running = sa.text("SELECT state = 'RUNNING' FROM trials WHERE trial_id = :id")

    def ask(query: sa.TextClause, **params: object) -> list:
        try:
            with engine.connect() as conn:
                return list(conn.execute(query, params))
        except sa.exc.SQLAlchemyError:
            return []  # no tables yet, or no connection free: look again

    try:
        patience = time.monotonic() + 30  # for `count` trials training together, then fewer
        while outcome.frozen < count:
            found = ask(training, count=count - outcome.frozen)
            if len(found) < count - outcome.frozen and time.monotonic() < patience:
                time.sleep(0.05)
                continue
            stopped = []
            for trial_id, pid in ((int(row[0]), int(row[1])) for row in found):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append((trial_id, pid))
            caught = [
                pid for trial_id, pid in stopped if any(r[0] for r in ask(running, id=trial_id))
            ]
            if caught:  # stopped while their trials run
                time.sleep(grace + 8)  # past the grace and the next look (every 5 s)
                outcome.frozen += len(caught)
            elif not stopped:
                time.sleep(0.2)
            for _, pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    finally:
        engine.dispose()


def run_scenario(
    *,
    hosts: int,
    slots: int,
    trials: int,
    trial_seconds: float,
    max_connections: int,
    sampler: str | None = None,
    timeout: float = 1800,
    logs: Path | None = None,
    freeze: int = 0,
) -> Outcome:
    """`freeze`: that many trial processes are stopped (SIGSTOP) past the heartbeat's grace
    period while they train, one after another, then let go: each trial is failed as lost and
    re-run, and its process tells late."""
    from tests.pg_cluster import PgCluster

    outcome = Outcome(hosts, slots, sampler, trials, max_connections, trial_seconds)
    common = ["--gpus", "sim:65536", "--concurrency", str(slots)]
    with (
        tempfile.TemporaryDirectory(prefix="orchestrator-connlimit-") as folder,
        PgCluster.create() as cluster,
    ):
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nmax_connections = {max_connections}\n")
        cluster.restart()
        url = cluster.create_database("limit")
        began = time.monotonic()
        started_at = time.time()
        first = _start(
            [
                "run",
                "synthetic",
                "--trials",
                str(trials),
                "--storage",
                url,
                "--option",
                f"trial_seconds={trial_seconds}",
                "--epochs",
                "1",
                "--pruner",
                "none",
                *common,
            ],  # fmt: skip
            Path(folder) / "host-1",
        )
        deadline = time.monotonic() + 300
        while not _study_exists(url) and first.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        others = [
            _start(
                ["worker", "--study", STUDY, "--storage", url, *common],
                Path(folder) / f"host-{n}",
            )
            for n in range(2, hosts + 1)
        ]
        freezer = threading.Thread(target=_freeze, args=(url, freeze, outcome), daemon=True)
        freezer.start()
        for process in [first, *others]:
            try:
                out, err = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:  # a host that hangs: it and its trial processes
                os.killpg(process.pid, 9)
                out, err = process.communicate()
            outcome.exit_statuses.append(process.returncode)
            text = out + err
            if logs is not None:  # each host's whole output, to read after
                logs.mkdir(parents=True, exist_ok=True)
                (logs / f"host-{len(outcome.exit_statuses)}.log").write_text(text)
            outcome.said_unreachable.append("unreachable" in text)
            outcome.host_lines.append(
                [
                    line[:300]
                    for line in text.splitlines()
                    if any(w in line for w in ("WARNING", "ERROR", "error", "Traceback"))
                ][:20]
            )
        freezer.join(timeout=60)
        outcome.seconds = round(time.monotonic() - began, 1)
        _count(url, outcome, started_at)
        log = cluster.log.read_text(errors="replace") if cluster.log.exists() else ""
        outcome.refused_connections = log.count("too many clients")
    return outcome


def table(outcome: Outcome) -> str:
    statuses = ", ".join(str(code) for code in outcome.exit_statuses)
    unreachable = sum(outcome.said_unreachable)
    return "\n".join(
        [
            "| hosts x slots | max_connections | trials finished / budget | trials stored "
            "| RUNNING left | exit status per host | said unreachable | longest stall "
            "| first trial end | refused connections | wall |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {outcome.hosts} x {outcome.slots} | {outcome.max_connections} "
            f"| {outcome.finished}/{outcome.budget} | {outcome.trials_stored} "
            f"| {outcome.running_left} | {statuses} | {unreachable} host(s) "
            f"| {outcome.longest_stall_s:.1f} s | {outcome.first_end_s:.0f} s "
            f"| {outcome.refused_connections} "
            f"| {outcome.seconds:.0f} s |",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--trial-seconds", type=float, default=0.2)
    parser.add_argument("--max-connections", type=int, default=20)
    parser.add_argument("--sampler", help="the study's sampler (default: the study's default)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--logs", type=Path, help="a folder for each host's whole output")
    parser.add_argument(
        "--freeze", type=int, default=0, help="trial processes to stop past the grace (SIGSTOP)"
    )
    args = parser.parse_args()
    outcome = run_scenario(
        hosts=args.hosts,
        slots=args.slots,
        trials=args.trials,
        trial_seconds=args.trial_seconds,
        max_connections=args.max_connections,
        sampler=args.sampler,
        logs=args.logs,
        freeze=args.freeze,
    )
    print(table(outcome))
    print(f"re-runs: {outcome.re_runs}; failed trials: {len(outcome.failures)}")
    for failure in outcome.failures:
        print(f"  {failure}")
    print(
        f"the longest stall began {outcome.stall_began_s:.0f} s after the first host started, "
        f"after {outcome.stall_after} trials had ended"
    )
    for n, lines in enumerate(outcome.host_lines, start=1):
        for line in lines[:5]:
            print(f"host {n}: {line}")
    print(
        f"target: {outcome.budget}/{outcome.budget}, exit 0 on every host, none re-run, no stall over "
        f"{STALL_TARGET_S:.0f} s: {'met' if outcome.met else 'MISSED'}"
    )
    Path(args.out).write_text(json.dumps({**asdict(outcome), "met": outcome.met}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
