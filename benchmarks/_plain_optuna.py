"""Plain Optuna on the orchestrator's own objective: what `bench_overhead.py` compares against.

    python benchmarks/_plain_optuna.py STORAGE_URL STUDY SAMPLER TRIALS EPOCHS

TRIALS more trials are run, in a new study or on top of an existing one of that name.

The same synthetic objective (adapters.synthetic, trial_seconds=0), the same sampler (PSO as
`run` builds it, or TPE with a constant liar), the same pruner and epochs, the same storage with
the same settings (an SQLite file in WAL mode, as `run` makes it), driven by `study.optimize` in
one process: the floor for the cost of a trial.
"""

from __future__ import annotations

import sqlite3
import sys

import optuna
import torch

from adapters.base import reporter
from adapters.synthetic import adapter
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import StudySpec, pruner_for
from samplers import make_sampler


def main() -> None:
    url, name, sampler, trials, epochs = sys.argv[1:6]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    location = StorageLocation.parse(url)
    path = location.sqlite_path
    if path is not None:  # the journal mode `run` sets on a study's file
        sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").connection.close()
    spec = StudySpec(
        adapter="synthetic", trials=int(trials), epochs=int(epochs), direction="minimize"
    )
    study = optuna.create_study(
        study_name=name,
        storage=location.url,
        sampler=make_sampler(sampler, seed=None, swarm_size=spec.swarm_size),
        pruner=pruner_for(spec),
        load_if_exists=True,  # bench_overhead's study-size part runs it on a filled study
    )
    options = {"trial_seconds": 0.0}
    cpu = torch.device("cpu")

    def objective(trial: optuna.Trial) -> float:
        params = adapter.suggest(trial, options)
        return adapter.train(
            params, epochs=spec.epochs, device=cpu, options=options, report=reporter(trial)
        )

    study.optimize(objective, n_trials=spec.trials)


if __name__ == "__main__":
    main()
