"""The orchestrator's own cost per trial, against plain Optuna, at any study size.

Four measurements, each in one run with interleaved repetitions (medians), on this machine:

1. empty trials: `run synthetic --option trial_seconds=0` (40 trials, one slot) against a plain
   `study.optimize` script on the same objective, sampler, pruner, epochs and kind of storage
   (SQLite file; PostgreSQL when a server is given), for PSO and TPE: wall time and CPU time;
2. study size: the time from one trial's start to the next (one slot, PSO) with 100, 1,000 and
   5,000 finished trials already in the study;
3. the budget lock: 10 trials at once on one study holding 3,000 trials against one holding 14:
   how long each ask waited for the lock and held it (recorded by every trial in orch_trial_vram);
4. the read-only views: `status`, `status --study`, `best` and `report` on a study of 3,000
   trials against one of 14;
5. RL on a CPU-only host: `run dqn` as planned (a slot per core) against `--concurrency 1`;
6. a fused group's asks: `run synthetic --fuse 8` against `--fuse 1` (empty trials, one slot):
   the time and CPU per trial of the whole command, and each trial's ask, the time it waited for
   the budget's lock and held it (a group asks its members one by one, under the same lock).

    python benchmarks/bench_overhead.py                       # everything, ~30 minutes
    python benchmarks/bench_overhead.py --only empty size     # some parts
    python benchmarks/bench_overhead.py --postgres postgresql://postgres@127.0.0.1:5432/postgres

It prints a table per part and writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ROOT / "benchmarks" / "_plain_optuna.py"
EPOCHS = 15  # the supervised workload class's default epochs, which `run synthetic` uses
PARTS = ("empty", "size", "lock", "views", "dqn", "fused")


# --- running things ----------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ORCHESTRATOR_STORAGE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def timed(command: list[str]) -> tuple[float, float]:
    """Run a command to the end: (wall seconds, CPU seconds of it and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def orchestrator(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


@contextlib.contextmanager
def database(kind: str, server: str | None) -> Iterator[str]:
    """A fresh, empty storage: an SQLite file, or a new PostgreSQL database dropped after."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    import sqlalchemy as sa

    assert server is not None
    name = f"orch_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def synthetic_run(url: str, study: str, trials: int, *extra: str) -> list[str]:
    return orchestrator(
        "run",
        "synthetic",
        "--study",
        study,
        "--trials",
        str(trials),
        "--gpus",
        "none",
        "--option",
        "trial_seconds=0",
        "--storage",
        url,
        "--json",
        *extra,
    )


# --- 1. empty trials ---------------------------------------------------------------------


def part_empty(kinds: list[str], server: str | None, reps: int, trials: int) -> list[dict]:
    rows = []
    for kind in kinds:
        for sampler in ("pso", "tpe"):
            runs: dict[str, list[tuple[float, float]]] = {"orchestrator": [], "optuna": []}
            for rep in range(reps):
                order = ("orchestrator", "optuna") if rep % 2 == 0 else ("optuna", "orchestrator")
                for who in order:
                    with database(kind, server) as url:
                        if who == "optuna":
                            command = [
                                sys.executable,
                                str(PLAIN),
                                url,
                                "plain",
                                sampler,
                                str(trials),
                                str(EPOCHS),
                            ]
                        else:
                            command = synthetic_run(url, "orch", trials, "--sampler", sampler)
                        runs[who].append(timed(command))
            ours = [statistics.median(x[i] for x in runs["orchestrator"]) for i in (0, 1)]
            theirs = [statistics.median(x[i] for x in runs["optuna"]) for i in (0, 1)]
            rows.append(
                {
                    "storage": kind,
                    "sampler": sampler,
                    "trials": trials,
                    "orchestrator_s": round(ours[0], 2),
                    "optuna_s": round(theirs[0], 2),
                    "wall_ratio": round(ours[0] / theirs[0], 2),
                    "orchestrator_cpu_s": round(ours[1], 2),
                    "optuna_cpu_s": round(theirs[1], 2),
                    "cpu_ratio": round(ours[1] / theirs[1], 2),
                }
            )
            print_rows("empty", rows[-1:], header=len(rows) == 1)
    return rows


# --- 2. study size -----------------------------------------------------------------------


def prefill(url: str, study_name: str, finished: int, *, epochs: int = EPOCHS) -> None:
    """Add finished trials until the study holds `finished`: PSO's records, a value per epoch
    and the user attributes a real trial leaves, so every read costs what it would."""
    import optuna

    from adapters.synthetic import synthetic_value
    from orchestrator.record.store.location import StorageLocation
    from samplers._space import to_unit

    study = optuna.load_study(study_name=study_name, storage=StorageLocation.parse(url).url)
    template = study.trials[0]
    dists = template.distributions
    rng = random.Random(0)
    new = []
    for number in range(len(study.trials), finished):
        params = {
            "x": rng.uniform(-5, 5),
            "y": rng.uniform(-5, 5),
            "learning_rate": 10 ** rng.uniform(-5, -1),
            "batch_size": int(round(2 ** rng.uniform(6, 12))),
            "activation": rng.choice(["gelu", "relu", "tanh"]),
        }
        value = synthetic_value(params)
        moves = {
            name: [to_unit(dists[name], params[name]), 0.0]
            for name in dists
            if name != "activation"
        }
        new.append(
            optuna.trial.create_trial(
                params=params,
                distributions=dists,
                value=value,
                intermediate_values={e: value + (epochs - 1 - e) / epochs for e in range(epochs)},
                system_attrs={"pso": {"p": number % 20, "x": moves}},
                user_attrs=dict(template.user_attrs),
            )
        )
    study.add_trials(new)


def steady_interval_s(url: str, study_name: str, after: int) -> float:
    """Median time from one trial's start to the next's, for trials numbered `after` and up."""
    import optuna

    from orchestrator.record.store.location import StorageLocation

    trials = optuna.load_study(
        study_name=study_name, storage=StorageLocation.parse(url).url
    ).get_trials(deepcopy=False)
    starts = sorted(t.datetime_start for t in trials if t.number >= after and t.datetime_start)
    gaps = [(b - a).total_seconds() for a, b in zip(starts[1:], starts[2:], strict=False)]
    return statistics.median(gaps)


def part_size(kinds: list[str], server: str | None, sizes: list[int], new: int) -> list[dict]:
    """Per-trial time on a filled study, the orchestrator's and then plain Optuna's on the same
    study (same sampler, pruner and epochs): what grows with the study in Optuna's own reads
    (its pruners read every finished trial at each report) grows in both."""
    rows = []
    for kind in kinds:
        measured = {}
        for size in sizes:
            with database(kind, server) as url:
                timed(synthetic_run(url, "grow", 1))
                prefill(url, "grow", size)
                wall, _ = timed(synthetic_run(url, "grow", size + new))
                ours = steady_interval_s(url, "grow", size)
                timed([sys.executable, str(PLAIN), url, "grow", "pso", str(new), str(EPOCHS)])
                plain = steady_interval_s(url, "grow", size + new)
                measured[size] = (ours, wall / new, plain)
        base = measured[sizes[0]]
        for size in sizes:
            interval, per_trial, plain = measured[size]
            rows.append(
                {
                    "storage": kind,
                    "finished_trials": size,
                    "new_trials": new,
                    "interval_ms": round(interval * 1000, 1),
                    "interval_ratio": round(interval / base[0], 2),
                    "run_s_per_trial": round(per_trial, 3),
                    "run_ratio": round(per_trial / base[1], 2),
                    "optuna_interval_ms": round(plain * 1000, 1),
                    "optuna_interval_ratio": round(plain / base[2], 2),
                }
            )
            print_rows("size", rows[-1:], header=len(rows) == 1)
    return rows


# --- 3. the budget lock ------------------------------------------------------------------


def part_lock(kinds: list[str], server: str | None, sizes: list[int], new: int) -> list[dict]:
    import sqlalchemy as sa

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.records import list_trial_vram

    rows = []
    for kind in kinds:
        for size in sizes:
            with database(kind, server) as url:
                timed(synthetic_run(url, "crowd", 1))
                prefill(url, "crowd", size)
                timed(
                    orchestrator(
                        "run",
                        "synthetic",
                        "--study",
                        "crowd",
                        "--trials",
                        str(size + new),
                        "--gpus",
                        "sim:81920",
                        "--concurrency",
                        "10",
                        "--option",
                        "trial_seconds=2",
                        "--storage",
                        url,
                        "--json",
                    )
                )
                engine = sa.create_engine(StorageLocation.parse(url).url)
                asks = [r for r in list_trial_vram(engine, "crowd") if r["ask_held_ms"] is not None]
                engine.dispose()
            held = sorted(r["ask_held_ms"] for r in asks)
            wait = sorted(r["ask_wait_ms"] for r in asks)
            rows.append(
                {
                    "storage": kind,
                    "finished_trials": size,
                    "asks": len(asks),
                    "held_ms_median": round(statistics.median(held), 1),
                    "held_ms_p95": round(held[int(0.95 * (len(held) - 1))], 1),
                    "wait_ms_median": round(statistics.median(wait), 1),
                    "wait_ms_p95": round(wait[int(0.95 * (len(wait) - 1))], 1),
                }
            )
            print_rows("lock", rows[-1:], header=len(rows) == 1)
    return rows


# --- 4. the views --------------------------------------------------------------------------


def part_views(sizes: list[int], reps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        urls = {}
        for size in sizes:
            urls[size] = f"sqlite:///{folder}/views{size}.db"
            timed(synthetic_run(urls[size], "views", 1))
            prefill(urls[size], "views", size)
        commands = {
            "status": ["status"],
            "status --study": ["status", "--study", "views"],
            "best": ["best", "--study", "views"],
            "report": ["report", "--study", "views", "--out", f"{folder}/report"],
        }
        rows = []
        for name, words in commands.items():
            times: dict[int, list[float]] = {size: [] for size in sizes}
            for rep in range(reps):
                for size in sizes if rep % 2 == 0 else sizes[::-1]:
                    times[size].append(timed(orchestrator(*words, "--storage", urls[size]))[0])
            medians = {size: statistics.median(times[size]) for size in sizes}
            row = {
                "command": name,
                **{f"{size}_trials_s": round(medians[size], 2) for size in sizes},
            }
            row["ratio"] = round(medians[sizes[-1]] / medians[sizes[0]], 2)
            rows.append(row)
            print_rows("views", rows[-1:], header=len(rows) == 1)
    return rows


# --- 5. RL on a CPU-only host ------------------------------------------------------------


def part_dqn(reps: int, trials: int) -> list[dict]:
    runs: dict[str, list[float]] = {"planned": [], "one at a time": []}
    for rep in range(reps):
        order = ("planned", "one at a time") if rep % 2 == 0 else ("one at a time", "planned")
        for who in order:
            with database("sqlite", None) as url:
                extra = ["--concurrency", "1"] if who == "one at a time" else []
                command = orchestrator(
                    "run", "dqn", "--trials", str(trials), "--pruner", "none", "--storage", url,
                    "--json", *extra,
                )  # fmt: skip
                runs[who].append(timed(command)[0])
    planned = statistics.median(runs["planned"])
    single = statistics.median(runs["one at a time"])
    from orchestrator.planning.cpu_cores import usable_cpu_cores

    row = {
        "trials": trials,
        "cores": usable_cpu_cores(),
        "planned_s": round(planned, 1),
        "one_at_a_time_s": round(single, 1),
        "ratio": round(planned / single, 2),
    }
    print_rows("dqn", [row], header=True)
    return [row]


# --- 6. a fused group's asks ---------------------------------------------------------------


def part_fused(kinds: list[str], server: str | None, reps: int, trials: int) -> list[dict]:
    import optuna
    import sqlalchemy as sa

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.records import list_trial_vram

    rows = []
    for kind in kinds:
        runs: dict[int, list[dict[str, float]]] = {1: [], 8: []}
        for rep in range(reps):
            for fuse in (1, 8) if rep % 2 == 0 else (8, 1):
                with database(kind, server) as url:
                    extra = ("--concurrency", "1", "--fuse", str(fuse), "--pruner", "none")
                    wall, cpu = timed(synthetic_run(url, "asks", trials, *extra))
                    engine = sa.create_engine(StorageLocation.parse(url).url)
                    asks = [
                        r for r in list_trial_vram(engine, "asks") if r["ask_held_ms"] is not None
                    ]
                    engine.dispose()
                    study = optuna.load_study(study_name="asks", storage=url)
                    fused = sum(bool(t.user_attrs.get("fused_with")) for t in study.trials)
                runs[fuse].append(
                    {
                        "fused": fused,
                        "wall": wall,
                        "cpu": cpu,
                        "held": statistics.median(r["ask_held_ms"] for r in asks),
                        "wait": statistics.median(r["ask_wait_ms"] for r in asks),
                    }
                )
        for fuse, done in runs.items():
            rows.append(
                {
                    "storage": kind,
                    "fuse": fuse,
                    "trials": trials,
                    "fused": min(r["fused"] for r in done),
                    "wall_ms_per_trial": round(
                        statistics.median(r["wall"] for r in done) / trials * 1000
                    ),
                    "cpu_ms_per_trial": round(
                        statistics.median(r["cpu"] for r in done) / trials * 1000
                    ),
                    "ask_held_ms": round(statistics.median(r["held"] for r in done), 1),
                    "ask_wait_ms": round(statistics.median(r["wait"] for r in done), 1),
                }
            )
        print_rows("fused", rows[-2:], header=len(rows) == 2)
    return rows


# --- output ------------------------------------------------------------------------------


def print_rows(part: str, rows: list[dict[str, Any]], *, header: bool) -> None:
    if not rows:
        return
    keys = list(rows[0])
    if header:
        print(f"\n[{part}]")
        print("  ".join(f"{key:>14}" for key in keys))
    for row in rows:
        print("  ".join(f"{row[key]!s:>14}" for key in keys), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the empty-trial runs")
    parser.add_argument("--trials", type=int, default=40, help="trials of the empty-trial runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--new", type=int, default=30, help="trials run on top of a filled study")
    parser.add_argument("--lock-sizes", type=int, nargs="+", default=[14, 3000])
    parser.add_argument("--dqn-trials", type=int, default=12)
    parser.add_argument("--dqn-reps", type=int, default=1)
    parser.add_argument("--fused-trials", type=int, default=64)
    parser.add_argument(
        "--postgres",
        default=os.environ.get("ORCHESTRATOR_TEST_POSTGRES"),
        help="a PostgreSQL server URL; its parts run on SQLite only without one",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overhead.json"))
    args = parser.parse_args()

    kinds = ["sqlite"] + (["postgres"] if args.postgres else [])
    results: dict[str, Any] = {"args": vars(args), "cores": os.cpu_count()}
    if "empty" in args.only:
        results["empty"] = part_empty(kinds, args.postgres, args.reps, args.trials)
    if "size" in args.only:
        results["size"] = part_size(kinds, args.postgres, args.sizes, args.new)
    if "lock" in args.only:
        results["lock"] = part_lock(kinds[-1:], args.postgres, args.lock_sizes, args.new)
    if "views" in args.only:
        results["views"] = part_views(args.lock_sizes, args.reps)
    if "dqn" in args.only:
        results["dqn"] = part_dqn(args.dqn_reps, args.dqn_trials)
    if "fused" in args.only:
        results["fused"] = part_fused(kinds, args.postgres, args.reps, args.fused_trials)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if out.exists() else {}
    previous.update(results)
    out.write_text(json.dumps(previous, indent=2, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
