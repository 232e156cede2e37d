"""What writing a trial's dashboard note and logging it to MLflow cost, per finished trial.

A trial process calls `orchestrator.record.trials.notes.write_trial_note` and `TrialTracker.log_trial` once
after `tell`; this measures one call of each on a study that already holds N finished trials with
notes (the note writer reads every study system attribute, so its cost grows with N), on an SQLite
file and on PostgreSQL, against `study.tell` as the yardstick. MLflow's store is an SQLite file.
Repetitions are interleaved (note, track, tell, note, ...) and medians are reported.

    python benchmarks/bench_trial_records.py                    # N = 10 and 500, 15 repetitions
    python benchmarks/bench_trial_records.py --sizes 10 2000 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import optuna

from orchestrator.record.trials.notes import write_trial_note
from orchestrator.record.trials.tracking import TrialTracker

RESULTS = Path(__file__).resolve().parent / "results" / "trial_records.json"
ATTRS = {
    "gpu": "NVIDIA L40S",
    "gpu_index": 0,
    "host": "node-a",
    "concurrency": 6,
    "batch_bounds": [64, 1391],
    "vram_planned_mb": 1638.0,
    "vram_peak_mb": 2948.4,
    "oom": False,
}


def finished_trial(study: optuna.Study, epochs: int = 10) -> optuna.trial.FrozenTrial:
    trial = study.ask()
    trial.suggest_float("x", -5, 5)
    trial.suggest_int("batch_size", 64, 4096, log=True)
    for name, value in ATTRS.items():
        trial.set_user_attr(name, value)
    for epoch in range(epochs):
        trial.report(1.0 / (epoch + 1), epoch)
    study.tell(trial, 0.1)
    return study._storage.get_trial(trial._trial_id)


def measure(url: str, size: int, repeats: int, mlflow_uri: str) -> dict[str, float]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=f"bench-{uuid.uuid4().hex[:8]}", storage=url)
    for _ in range(size):  # a study that already holds `size` noted trials
        write_trial_note(study, finished_trial(study, epochs=1))
    tracker = TrialTracker(mlflow_uri, experiment=study.study_name, metric="loss")
    tracker.log_trial(finished_trial(study))  # opens the store and makes the experiment
    times: dict[str, list[float]] = {"tell": [], "note": [], "mlflow": []}
    for _ in range(repeats):
        trial = study.ask()
        trial.suggest_float("x", -5, 5)
        started = time.perf_counter()
        study.tell(trial, 0.5)
        times["tell"].append(time.perf_counter() - started)
        frozen = finished_trial(study)
        started = time.perf_counter()
        write_trial_note(study, frozen)
        times["note"].append(time.perf_counter() - started)
        started = time.perf_counter()
        assert tracker.log_trial(frozen) is not None
        times["mlflow"].append(time.perf_counter() - started)
    return {key: statistics.median(values) * 1000 for key, values in times.items()}


class ThrowawayDatabase:
    """A database of its own on the PostgreSQL server, dropped afterwards."""

    def __init__(self, server: str) -> None:
        import sqlalchemy as sa

        self.name = f"bench_{uuid.uuid4().hex[:10]}"
        self.admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        self.url = sa.engine.make_url(server).set(database=self.name).render_as_string(False)

    def drop(self) -> None:
        import sqlalchemy as sa

        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 500])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    postgres = os.environ.get("ORCHESTRATOR_TEST_POSTGRES")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        mlflow_uri = f"sqlite:///{Path(folder) / 'mlflow.db'}"
        storages = {"SQLite file": f"sqlite:///{Path(folder) / 'study.db'}"}
        database = ThrowawayDatabase(postgres) if postgres else None
        if database is not None:
            storages["PostgreSQL"] = database.url
        try:
            for label, url in storages.items():
                for size in args.sizes:
                    ms = measure(url, size, args.repeats, mlflow_uri)
                    results.append({"storage": label, "trials": size, **ms})
        finally:
            if database is not None:
                database.drop()
    print(f"median ms per finished trial, {args.repeats} interleaved repetitions")
    print(f"{'storage':<12} {'trials':>7} {'tell':>8} {'note':>8} {'mlflow':>8}")
    for row in results:
        print(
            f"{row['storage']:<12} {row['trials']:>7} {row['tell']:>8.1f} "
            f"{row['note']:>8.1f} {row['mlflow']:>8.1f}"
        )
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
