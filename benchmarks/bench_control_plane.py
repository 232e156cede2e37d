"""The control plane under many trial processes: the budget lock and the ask on one PostgreSQL study.

For 8, 32 and 64 trial processes at once, each configuration on a fresh study of 10,000 trials
(all but the last `--asks` already finished, written straight into Optuna's tables), every
process asks for trials until the budget is used, and tells each one at once. The processes are
lightweight: no torch, no adapter, no supervisor; each runs what a warm trial process runs to
ask (`orchestrator.run.trial_runner.ask`: the cache read, then count and create under the
budget lock) on a storage opened as a trial process opens it (one connection), then tells.

Measured per ask: the wait for the lock, the time the lock was held (taking it to the claim's
commit: `budget_section.last_times`), the whole ask, and, with `--breakdown`, where the held
time goes (the count, the create with its commit). The ceiling of trial starts per second that
the lock allows is 1000 / median held ms. The study's budget is checked exact at the end.

    python benchmarks/bench_control_plane.py --postgres postgresql+psycopg2://postgres@127.0.0.1:5432/postgres
    python benchmarks/bench_control_plane.py --postgres URL --processes 8 --asks 400 --breakdown
    python benchmarks/bench_control_plane.py --postgres URL --through URL_OF_A_PGBOUNCER ...

`--through` sends the processes' connections to another address (a PgBouncer in front of the
same server) while the study is made and checked on the server itself. Prints a table and
writes benchmarks/results/control_plane.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "control_plane.json"
STUDY = "control-plane"


# --- the study -----------------------------------------------------------------------------


def _make_database(server: str) -> str:
    import sqlalchemy as sa

    name = f"bench_cp_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return name


def _drop_database(server: str, name: str) -> None:
    import sqlalchemy as sa

    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _with_database(url: str, name: str) -> str:
    import sqlalchemy as sa

    return sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)


def prepare_study(url: str, trials: int, asks: int) -> None:
    """A study whose budget is `trials`, with `trials - asks` finished ones already in it, each
    with a value and the ask mark every orchestrator trial carries."""
    import optuna
    import sqlalchemy as sa

    from orchestrator.record.migrate import open_storage
    from orchestrator.record.study import StudySpec, save_spec

    storage = open_storage(url)
    study = optuna.create_study(study_name=STUDY, storage=storage)
    save_spec(
        study,
        StudySpec(
            adapter="synthetic", trials=trials, epochs=1, direction="minimize", sampler="random"
        ),
    )
    finished = trials - asks
    with storage.engine.begin() as conn:
        params = {"study": study._study_id, "n": finished}
        conn.execute(
            sa.text(
                "INSERT INTO trials (number, study_id, state, datetime_start, datetime_complete) "
                "SELECT g, :study, 'COMPLETE', now(), now() FROM generate_series(0, :n - 1) g"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "INSERT INTO trial_values (trial_id, objective, value, value_type) "
                "SELECT trial_id, 0, random(), 'FINITE' FROM trials WHERE study_id = :study"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "INSERT INTO trial_system_attributes (trial_id, key, value_json) "
                "SELECT trial_id, 'orchestrator:ask', '\"' || md5(trial_id::text) || '\"' "
                "FROM trials WHERE study_id = :study"
            ),
            params,
        )
    storage.engine.dispose()


def check_study(url: str, trials: int) -> dict[str, int]:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT state, count(*) FROM trials GROUP BY state")).all()
    engine.dispose()
    states = {str(state): int(n) for state, n in rows}
    if sum(states.values()) != trials or states.get("COMPLETE", 0) != trials:
        raise SystemExit(f"the budget was not exact: {states} for a budget of {trials}")
    return states


# --- one trial process ---------------------------------------------------------------------


def child(url: str, folder: Path, index: int, breakdown: bool) -> None:
    """Ask and tell until the budget is used; write every ask's times to folder/INDEX.json."""
    from types import SimpleNamespace

    import optuna

    from orchestrator.record import budget_section, riding_storage, trial_counts
    from orchestrator.record.storage import create_storage
    from orchestrator.record.study import load_spec
    from orchestrator.run.trial_runner import ask

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = create_storage(url, heartbeat=True, wait=True)  # as a trial process opens it
    study = optuna.load_study(
        study_name=STUDY, storage=storage, sampler=optuna.samplers.RandomSampler()
    )
    spec = load_spec(study)
    ctx = SimpleNamespace(
        study=study,
        storage=storage,
        engine=storage.engine,
        study_id=study._study_id,
        config=SimpleNamespace(storage_url=url, study_name=STUDY),
    )
    steps: dict[str, float] = {}
    if breakdown:
        _time_steps(trial_counts, riding_storage, steps)
    study._storage.get_all_trials(study._study_id, deepcopy=False)  # the warm process's cache
    (folder / f"{index}.ready").touch()
    while not (folder / "go").exists():
        time.sleep(0.005)
    asks: list[dict[str, float]] = []
    while True:
        steps.clear()
        started = time.perf_counter()
        trial, _ = ask(ctx, spec)
        asked = time.perf_counter()
        if trial is None:
            break
        study.tell(trial, 0.0)
        told = time.perf_counter()
        times = budget_section.last_times()
        assert times is not None
        asks.append(
            {
                "wait_ms": times.wait_ms,
                "held_ms": times.held_ms,
                "held_cpu_ms": times.held_cpu_ms,
                "ask_ms": (asked - started) * 1000,
                "tell_ms": (told - asked) * 1000,
                "at": told,
                **steps,
            }
        )
    (folder / f"{index}.json").write_text(json.dumps(asks))


def _time_steps(trial_counts: Any, riding_storage: Any, steps: dict[str, float]) -> None:
    """Time the count and the create inside the lock (the module attributes the ask looks up)."""

    def timed(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                steps[name] = steps.get(name, 0.0) + (time.perf_counter() - start) * 1000

        return call

    trial_counts.stored_count = timed("count_ms", trial_counts.stored_count)
    riding_storage._create_once = timed("create_ms", riding_storage._create_once)


# --- one configuration ---------------------------------------------------------------------


def run_configuration(
    server: str, through: str | None, processes: int, trials: int, asks: int, breakdown: bool
) -> dict[str, Any]:
    name = _make_database(server)
    direct = _with_database(server, name)
    url = _with_database(through or server, name)
    try:
        prepare_study(direct, trials, asks)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            }
            command = [sys.executable, __file__, "--child", url, str(folder)]
            if breakdown:
                command.append("--breakdown")
            children = [
                subprocess.Popen([*command, str(i)], env=env, cwd=ROOT) for i in range(processes)
            ]
            while sum(1 for _ in folder.glob("*.ready")) < processes:
                if any(c.poll() not in (None, 0) for c in children):
                    raise SystemExit("a trial process failed before it was ready")
                time.sleep(0.1)
            go = time.perf_counter()
            (folder / "go").touch()
            for c in children:
                if c.wait() != 0:
                    raise SystemExit(f"a trial process exited with {c.returncode}")
            records = [
                a for i in range(processes) for a in json.loads((folder / f"{i}.json").read_text())
            ]
        states = check_study(direct, trials)
    finally:
        _drop_database(server, name)
    return summarise(processes, trials, records, go, states, breakdown)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(
    processes: int,
    trials: int,
    records: list[dict[str, float]],
    go: float,
    states: dict[str, int],
    breakdown: bool,
) -> dict[str, Any]:
    held = [r["held_ms"] for r in records]
    wait = [r["wait_ms"] for r in records]
    ask_ms = [r["ask_ms"] for r in records]
    span = max(r["at"] for r in records) - go
    row: dict[str, Any] = {
        "processes": processes,
        "study_trials": trials,
        "asks": len(records),
        "held_median_ms": round(statistics.median(held), 2),
        "held_p99_ms": round(_pct(held, 0.99), 2),
        "held_cpu_median_ms": round(statistics.median(r["held_cpu_ms"] for r in records), 2),
        "wait_median_ms": round(statistics.median(wait), 2),
        "wait_p99_ms": round(_pct(wait, 0.99), 2),
        "ask_median_ms": round(statistics.median(ask_ms), 2),
        "ask_p99_ms": round(_pct(ask_ms, 0.99), 2),
        "ceiling_starts_per_s": round(1000 / statistics.median(held), 1),
        "measured_asks_per_s": round(len(records) / span, 1),
        "states": states,
    }
    if breakdown:
        for step in ("count_ms", "create_ms"):
            row[f"{step[:-3]}_median_ms"] = round(
                statistics.median(r.get(step, 0.0) for r in records), 2
            )
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| processes | asks | lock held median / p99 ms | lock wait median / p99 ms "
        "| held CPU median ms | ask median / p99 ms | ceiling starts/s | measured asks/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['processes']} | {r['asks']} | {r['held_median_ms']} / {r['held_p99_ms']} "
            f"| {r['wait_median_ms']} / {r['wait_p99_ms']} | {r['held_cpu_median_ms']} "
            f"| {r['ask_median_ms']} / {r['ask_p99_ms']} "
            f"| {r['ceiling_starts_per_s']} | {r['measured_asks_per_s']} |"
        )
    if any("count_median_ms" in r for r in rows):
        print("\n| processes | held median ms | count median ms | create + claim median ms |")
        print("|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['processes']} | {r['held_median_ms']} | {r.get('count_median_ms')} "
                f"| {r.get('create_median_ms')} |"
            )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, folder = sys.argv[2], Path(sys.argv[3])
        breakdown = "--breakdown" in sys.argv
        child(url, folder, int(sys.argv[-1]), breakdown)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", required=True, help="a PostgreSQL server URL")
    parser.add_argument("--through", help="the processes connect here instead (a PgBouncer)")
    parser.add_argument("--processes", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--trials", type=int, default=10_000, help="the study's budget")
    parser.add_argument("--asks", type=int, default=1_000, help="trials left to ask for")
    parser.add_argument("--breakdown", action="store_true", help="time the steps inside the lock")
    args = parser.parse_args()
    rows = []
    for n in args.processes:
        row = run_configuration(
            args.postgres, args.through, n, args.trials, args.asks, args.breakdown
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print_table(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    key = "through" if args.through else "direct"
    previous[key] = {
        "command": " ".join(sys.argv),
        "rows": rows,
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    RESULTS.write_text(json.dumps(previous, indent=2) + "\n")


if __name__ == "__main__":
    main()
