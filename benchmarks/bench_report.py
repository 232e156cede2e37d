"""The cost of `report` on a study of 3,000 trials: wall and CPU seconds of the real command.

The study is made as a real one is: `run synthetic` on two simulated GPUs writes its first
trials with every record a trial leaves (attributes, VRAM rows, concurrency events, logs);
copies of those trials, each shifted later in time, fill it up to `--trials`, with their VRAM
rows, so the GPU timeline, the slice and contour plots and the table see 3,000 real-looking
trials. Then `python -m orchestrator report` runs `--reps` times; the medians are printed.

    nice -n 10 python benchmarks/bench_report.py --trials 3000 --reps 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED_TRIALS = 24


def orchestrator(*argv: str, cwd: Path) -> float:
    """Run one command; its CPU seconds (its own and its children's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fill(url: str, study_name: str, total: int) -> None:
    """Copies of the study's trials, each round later than the last, until it holds `total`."""
    import optuna
    import sqlalchemy as sa

    from orchestrator.record.store.records import list_trial_vram, trial_vram

    study = optuna.load_study(study_name=study_name, storage=url)
    seeds = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    start = min(t.datetime_start for t in seeds)
    span = max(t.datetime_complete for t in seeds) - start + dt.timedelta(seconds=1)
    engine = sa.create_engine(url)
    vram = {row["trial_number"]: row for row in list_trial_vram(engine, study_name)}
    copies, rows = [], []
    for number in range(len(study.trials), total):
        seed = seeds[number % len(seeds)]
        shift = span * (number // len(seeds))
        copies.append(
            optuna.trial.FrozenTrial(
                number=number,
                state=seed.state,
                value=None,
                values=seed.values,
                datetime_start=seed.datetime_start + shift,
                datetime_complete=seed.datetime_complete + shift,
                params=seed.params,
                distributions=seed.distributions,
                user_attrs=seed.user_attrs,
                system_attrs=seed.system_attrs,
                intermediate_values=seed.intermediate_values,
                trial_id=0,
            )
        )
        if seed.number in vram:
            row = {k: v for k, v in vram[seed.number].items() if k != "id"}
            rows.append({**row, "trial_number": number, "recorded_at": row["recorded_at"] + shift})
    study.add_trials(copies)
    with engine.begin() as conn:
        conn.execute(sa.insert(trial_vram), rows)
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="make the study here and keep it")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'report.db'}"
    if not (folder / "report.db").exists():
        orchestrator(
            "run", "synthetic", "--trials", str(SEED_TRIALS), "--epochs", "3",
            "--gpus", "sim:12288,sim:24576", "--option", "trial_seconds=0.2",
            "--storage", url, "--quiet", cwd=folder,
        )  # fmt: skip
        fill(url, "synthetic", args.trials)
    walls, cpus = [], []
    for _ in range(args.reps):
        started = time.perf_counter()
        cpus.append(orchestrator("report", "--storage", url, "--out", "report", cwd=folder))
        walls.append(time.perf_counter() - started)
    print(f"report on {args.trials:,} trials: wall {statistics.median(walls):.2f} s, "
          f"CPU {statistics.median(cpus):.2f} s (median of {args.reps})")  # fmt: skip


if __name__ == "__main__":
    main()
