"""How long `samplers.recommend(study)` takes as a study grows.

A study of N finished trials on a noisy objective of five parameters (two floats, one of
them on a log scale, an int and a categorical), made in memory by Optuna's random sampler;
then `recommend` is timed on it, the median of a few calls (scipy already imported, as in any
command that has read a study). The fit takes at most `samplers._model.gp.MAX_POINTS`
configurations, and every configuration is scored. Then the same study is written to an SQLite
file and the whole `python -m orchestrator best` command is timed on it, as a user runs it (a
new process: imports, reading the study, the recommendation, the lines).

    python benchmarks/bench_recommend.py                    # 100, 300, 1,000 and 3,000 trials
    python benchmarks/bench_recommend.py --sizes 1000 --calls 5

It prints a Markdown table and writes it to benchmarks/results/recommend.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


def noisy_study(size: int, seed: int = 0):
    import optuna
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    rng = np.random.default_rng(seed)
    dists = {
        "lr": FloatDistribution(1e-5, 1e-1, log=True),
        "dropout": FloatDistribution(0.0, 0.5),
        "layers": IntDistribution(1, 8),
        "width": IntDistribution(16, 1024, log=True),
        "optimizer": CategoricalDistribution(["sgd", "adam", "adamw"]),
    }
    trials = []
    for _ in range(size):
        params = {
            "lr": float(10 ** rng.uniform(-5, -1)),
            "dropout": float(rng.uniform(0, 0.5)),
            "layers": int(rng.integers(1, 9)),
            "width": int(round(2 ** rng.uniform(4, 10))),
            "optimizer": str(rng.choice(["sgd", "adam", "adamw"])),
        }
        value = (
            0.3 * (math.log10(params["lr"]) + 3) ** 2
            + (params["dropout"] - 0.2) ** 2
            + 0.05 * abs(params["layers"] - 4)
            + 1.0 / math.sqrt(params["width"])
            + {"sgd": 0.1, "adam": 0.0, "adamw": -0.02}[params["optimizer"]]
            + 0.2 * float(rng.standard_normal())
        )
        trials.append(optuna.trial.create_trial(params=params, distributions=dists, value=value))
    study = optuna.create_study()
    study.add_trials(trials)
    return study


def best_seconds(study, calls: int) -> float:
    """The median wall time of `python -m orchestrator best` on `study` written to SQLite."""
    import optuna

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/study.db"
        stored = optuna.create_study(study_name="noisy", storage=url)
        stored.add_trials(study.trials)
        command = [sys.executable, "-m", "orchestrator", "best", "--study", "noisy"]
        seconds = []
        for _ in range(calls):
            start = time.perf_counter()
            subprocess.run([*command, "--storage", url], check=True, capture_output=True)
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[100, 300, 1000, 3000])
    parser.add_argument("--calls", type=int, default=3, help="calls timed per size (median)")
    args = parser.parse_args(argv)

    import optuna

    from samplers import recommend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    recommend(noisy_study(20))  # scipy's import and the first fit, not counted
    lines = [
        "Command: `" + " ".join(["python benchmarks/bench_recommend.py", *sys.argv[1:]]) + "`",
        "",
        f"`recommend(study)` on a study of N finished trials (in memory), median of "
        f"{args.calls} calls: wall and CPU seconds.",
        "",
        "`best`: the whole command on the same study in an SQLite file, wall seconds, median.",
        "",
        "| trials | wall s | CPU s | `best` wall s |",
        "|---:|---:|---:|---:|",
    ]
    for size in args.sizes:
        study = noisy_study(size)
        walls, cpus = [], []
        for _ in range(args.calls):
            wall, cpu = time.perf_counter(), time.process_time()
            recommend(study)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        lines.append(
            f"| {size:,} | {statistics.median(walls):.3f} | {statistics.median(cpus):.3f} "
            f"| {best_seconds(study, args.calls):.2f} |"
        )
        print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "recommend.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
