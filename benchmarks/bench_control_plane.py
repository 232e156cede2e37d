"""The control plane under many trial processes: the budget lock and the ask on one PostgreSQL study.

For 8, 32 and 64 trial processes at once, each configuration on a fresh study of 10,000 trials
(all but the last `--asks` already finished, written straight into Optuna's tables), every
process asks for trials until the budget is used, and tells each one at once. The processes are
lightweight: no torch, no adapter, no supervisor; each asks as a warm trial process asks
(`orchestrator.record.budget.claim.ask_within_budget`: the claim in one round trip, then the
trial read back) on a storage opened as a trial process opens it (one connection), then tells.
No process reads the study before it asks: the ask does not need it.

Measured per ask, on the server's clock: the time the lock was held (granted to the claim's last
statement; its commit follows), the commit and hand-over (from one claim's last statement to the
next claim's grant, where that next claim was already waiting: what the held figure leaves out)
and the time from one grant of the lock to the next; on the client's clock: the wait for the
lock and the whole ask. The ceiling of trial starts per second is 1000 / (median held ms +
median commit and hand-over ms). The study's budget is checked exact at the end, and the host's
load average is sampled every second while the processes ask.

    python benchmarks/bench_control_plane.py --postgres postgresql+psycopg2://postgres@127.0.0.1:5432/postgres
    python benchmarks/bench_control_plane.py --postgres URL --processes 8 --asks 400
    python benchmarks/bench_control_plane.py --postgres URL --through URL_OF_A_PGBOUNCER ...

`--through` sends the processes' connections to another address (a PgBouncer in front of the
same server) while the study is made and checked on the server itself; `--pgbouncer POOL_SIZE`
starts such a PgBouncer (transaction mode) for the run. Prints a table and
writes benchmarks/results/control_plane.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.record.store.location import StorageLocation

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

    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.study.spec import StudySpec, save_spec

    storage = open_storage(StorageLocation.parse(url))
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


def child(url: str, folder: Path, index: int) -> None:
    """Ask and tell until the budget is used; write every ask's times to folder/INDEX.json."""
    import optuna

    from orchestrator.record.budget import section as budget_section
    from orchestrator.record.budget.claim import ask_within_budget, last_claim
    from orchestrator.record.store.storage import create_storage
    from orchestrator.record.study.spec import load_spec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = create_storage(
        StorageLocation.parse(url), heartbeat=True, wait=True
    )  # as a trial process opens it
    study = optuna.load_study(
        study_name=STUDY, storage=storage, sampler=optuna.samplers.RandomSampler()
    )
    spec = load_spec(study)
    (folder / f"{index}.ready").touch()
    while not (folder / "go").exists():
        time.sleep(0.005)
    asks: list[dict[str, float]] = []
    while True:
        started = time.perf_counter()
        # The trial process's ask: the claim in one round trip, then the trial read back.
        trial = ask_within_budget(study, StorageLocation.parse(url), spec.trials)
        asked = time.perf_counter()
        if trial is None:
            break
        study.tell(trial, 0.0)
        told = time.perf_counter()
        times, claim = budget_section.last_times(), last_claim()
        assert times is not None and claim is not None
        asks.append(
            {
                "wait_ms": times.wait_ms,
                "held_ms": times.held_ms,
                "granted_at": claim.locked_at,
                "done_at": claim.done_at,
                "sent_at": claim.sent_at,
                "ask_ms": (asked - started) * 1000,
                "tell_ms": (told - asked) * 1000,
                "at": told,
            }
        )
    (folder / f"{index}.json").write_text(json.dumps(asks))


# --- one configuration ---------------------------------------------------------------------


def run_configuration(
    server: str, through: str | None, processes: int, trials: int, asks: int
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
            children = [
                subprocess.Popen([*command, str(i)], env=env, cwd=ROOT) for i in range(processes)
            ]
            while sum(1 for _ in folder.glob("*.ready")) < processes:
                if any(c.poll() not in (None, 0) for c in children):
                    raise SystemExit("a trial process failed before it was ready")
                time.sleep(0.1)
            load = LoadSampler()
            go = time.perf_counter()
            (folder / "go").touch()
            for c in children:
                if c.wait() != 0:
                    raise SystemExit(f"a trial process exited with {c.returncode}")
            loads = load.stop()
            records = [
                a for i in range(processes) for a in json.loads((folder / f"{i}.json").read_text())
            ]
        states = check_study(direct, trials)
    finally:
        _drop_database(server, name)
    return summarise(processes, trials, records, go, states, loads)


class LoadSampler:
    """The host's 1-minute load average, read every second while the processes ask."""

    def __init__(self) -> None:
        import threading

        self.samples: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(1.0):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._done.set()
        self._thread.join()
        return self.samples or [os.getloadavg()[0]]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(
    processes: int,
    trials: int,
    records: list[dict[str, float]],
    go: float,
    states: dict[str, int],
    loads: list[float],
) -> dict[str, Any]:
    held = [r["held_ms"] for r in records]
    wait = [r["wait_ms"] for r in records]
    ask_ms = [r["ask_ms"] for r in records]
    grants = sorted(records, key=lambda r: r["granted_at"])
    pairs = list(zip(grants, grants[1:], strict=False))
    # From one grant of the lock to the next, on the server's clock: the held time, the commit
    # and the hand-over to the next waiter (plus any moment nobody was waiting).
    between = [(b["granted_at"] - a["granted_at"]) * 1000 for a, b in pairs]
    # Where the next claim was already waiting when this one's statements were done: the gap to
    # its grant is this claim's commit and the hand-over, the part of the lock's time that the
    # held figure leaves out.
    handover = [
        (b["granted_at"] - a["done_at"]) * 1000 for a, b in pairs if b["sent_at"] < a["done_at"]
    ]
    span = max(r["at"] for r in records) - go
    return {
        "processes": processes,
        "study_trials": trials,
        "asks": len(records),
        "held_median_ms": round(statistics.median(held), 2),
        "held_p99_ms": round(_pct(held, 0.99), 2),
        "grant_to_grant_median_ms": round(statistics.median(between), 2),
        "grant_to_grant_p99_ms": round(_pct(between, 0.99), 2),
        "contended_handovers": len(handover),
        "handover_median_ms": round(statistics.median(handover), 2) if handover else None,
        "handover_p99_ms": round(_pct(handover, 0.99), 2) if handover else None,
        "wait_median_ms": round(statistics.median(wait), 2),
        "wait_p99_ms": round(_pct(wait, 0.99), 2),
        "ask_median_ms": round(statistics.median(ask_ms), 2),
        "ask_p99_ms": round(_pct(ask_ms, 0.99), 2),
        "ceiling_starts_per_s": round(
            1000 / (statistics.median(held) + (statistics.median(handover) if handover else 0)), 1
        ),
        "measured_asks_per_s": round(len(records) / span, 1),
        "load_average": [round(min(loads), 1), round(max(loads), 1)],
        "states": states,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| processes | asks | lock held median / p99 ms | commit and hand-over median / p99 ms "
        "(samples) | grant to grant median / p99 ms "
        "| lock wait median / p99 ms | ask median / p99 ms | ceiling starts/s "
        "| measured asks/s | load average |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        low, high = r["load_average"]
        print(
            f"| {r['processes']} | {r['asks']} | {r['held_median_ms']} / {r['held_p99_ms']} "
            f"| {r['handover_median_ms']} / {r['handover_p99_ms']} ({r['contended_handovers']}) "
            f"| {r['grant_to_grant_median_ms']} / {r['grant_to_grant_p99_ms']} "
            f"| {r['wait_median_ms']} / {r['wait_p99_ms']} "
            f"| {r['ask_median_ms']} / {r['ask_p99_ms']} "
            f"| {r['ceiling_starts_per_s']} | {r['measured_asks_per_s']} | {low}-{high} |"
        )


@contextlib.contextmanager
def _bouncer(server: str, pool_size: int) -> Iterator[str]:
    """A PgBouncer of this run's own in front of `server`: the URL the processes use."""
    import sqlalchemy as sa

    sys.path.insert(0, str(ROOT))
    from tests.pgbouncer import PgBouncer

    address = sa.engine.make_url(server)
    with PgBouncer.start(address.port or 5432, pool_size=pool_size) as bouncer:
        yield str(address.set(port=bouncer.port).render_as_string(hide_password=False))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", required=True, help="a PostgreSQL server URL")
    parser.add_argument("--through", help="the processes connect here instead (a PgBouncer)")
    parser.add_argument(
        "--pgbouncer",
        type=int,
        metavar="POOL_SIZE",
        help="start a PgBouncer (transaction mode, POOL_SIZE server connections) in front of "
        "--postgres for the processes (tests/pgbouncer.py; needs Debian's pgbouncer)",
    )
    parser.add_argument("--processes", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--trials", type=int, default=10_000, help="the study's budget")
    parser.add_argument("--asks", type=int, default=1_000, help="trials left to ask for")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        through = args.through
        if args.pgbouncer:
            through = stack.enter_context(_bouncer(args.postgres, args.pgbouncer))
        rows = []
        for n in args.processes:
            row = run_configuration(args.postgres, through, n, args.trials, args.asks)
            row["through"] = f"pgbouncer, pool of {args.pgbouncer}" if args.pgbouncer else through
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print_table(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    key = "through" if through else "direct"
    previous[key] = {
        "command": " ".join(sys.argv),
        "rows": rows,
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    RESULTS.write_text(json.dumps(previous, indent=2) + "\n")


if __name__ == "__main__":
    main()
