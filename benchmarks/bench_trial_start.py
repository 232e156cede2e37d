"""Many slots start as fast as one: time from `run` to its first trial's start, 1 slot against 19.

`run synthetic` with 20 one-second trials on a simulated 24 GB GPU, as a user runs it (a real
process, its SQLite file, its trial processes), once with `--concurrency 1` and once with the
plan's 19 slots, each with trial processes forked from the fork server (the default) and spawned
(`ORCHESTRATOR_TRIAL_START=spawn`, how every trial process started before). The figures are read
back from the study: the first trial's `datetime_start` and `datetime_complete` against the
moment the command was launched, and the command's wall time. The four set-ups take turns, so
load on a shared machine falls on each alike; medians of `--repeats`.

Target: the first trial of the 19-slot run starts within 2 s of the one-slot run's.

    python benchmarks/bench_trial_start.py                 # 3 repeats
    python benchmarks/bench_trial_start.py --repeats 1     # quicker
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
from datetime import datetime
from pathlib import Path

SETUPS = (  # (name, start method, --concurrency or None for the plan's slots)
    ("fork server, 1 slot", "forkserver", 1),
    ("fork server, 19 slots", "forkserver", None),
    ("spawn, 1 slot", "spawn", 1),
    ("spawn, 19 slots", "spawn", None),
)


def run_once(method: str, concurrency: int | None, trials: int, workdir: Path) -> dict:
    db = workdir / f"start-{method}-{concurrency}-{time.monotonic_ns()}.db"
    url = f"sqlite:///{db}"
    command = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "synthetic",
        "--trials",
        str(trials),
        "--storage",
        url,
        "--gpus",
        "sim:24576",
        "--option",
        "trial_seconds=1",
        "--epochs",
        "1",
        "--pruner",
        "none",
    ]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    env = {**os.environ, "ORCHESTRATOR_TRIAL_START": method, "PYTHONUNBUFFERED": "1"}
    env.pop("ORCHESTRATOR_STORAGE", None)
    launched = datetime.now()
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"run failed ({method}, {concurrency}): {done.stderr[-2000:]}")
    import optuna

    study = optuna.load_study(study_name="synthetic", storage=url)
    starts = [t.datetime_start for t in study.trials if t.datetime_start]
    ends = [t.datetime_complete for t in study.trials if t.datetime_complete]
    at_once = max(t.user_attrs.get("concurrency", 1) for t in study.trials)
    return {
        "first_start_s": (min(starts) - launched).total_seconds(),
        "first_end_s": (min(ends) - launched).total_seconds(),
        "wall_s": wall,
        "slots": at_once,
        "trials": len(study.trials),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/trial_start.json")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {name: [] for name, _, _ in SETUPS}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.repeats):
            for name, method, concurrency in SETUPS:
                runs[name].append(run_once(method, concurrency, args.trials, Path(workdir)))
    rows = []
    for name, method, _ in SETUPS:
        results = runs[name]
        rows.append(
            {
                "setup": name,
                "start_method": method,
                "slots": max(r["slots"] for r in results),
                "first_start_s": round(statistics.median(r["first_start_s"] for r in results), 2),
                "first_end_s": round(statistics.median(r["first_end_s"] for r in results), 2),
                "wall_s": round(statistics.median(r["wall_s"] for r in results), 2),
                "runs": results,
            }
        )
    print(
        f"run synthetic: {args.trials} one-second trials on sim:24576; "
        f"seconds after launch, median of {args.repeats}"
    )
    print(f"{'setup':<24} {'slots':>5} {'first start':>11} {'first end':>9} {'study':>7}")
    for row in rows:
        print(
            f"{row['setup']:<24} {row['slots']:>5} {row['first_start_s']:>11.2f} "
            f"{row['first_end_s']:>9.2f} {row['wall_s']:>7.2f}"
        )
    by = {row["setup"]: row for row in rows}
    for method in ("fork server", "spawn"):
        gap = by[f"{method}, 19 slots"]["first_start_s"] - by[f"{method}, 1 slot"]["first_start_s"]
        print(f"{method}: 19 slots' first start {gap:+.2f} s against one slot's (target <= 2 s)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
