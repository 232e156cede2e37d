"""How well and how fast the samplers search, with trials evaluated in parallel.

Standard test functions (sphere, Rosenbrock, Rastrigin, Ackley, Styblinski-Tang) in several
dimensions, minimised under a fixed budget of trials with `--in-flight` trials running at once:
the loop asks that many trials, then tells one as it finishes (finish times are drawn at random
from the seed) and asks the next, which is what a pool of workers does. Reported: the median over
seeds of the best value found, for PSOSampler and Optuna's Random, QMC, TPE (constant liar, as
Optuna advises for parallel runs) and CMA-ES samplers. Then the sampler's own time per trial
(ask + suggest + tell, in memory) when the study already holds 1,000 and 10,000 trials.

    python benchmarks/bench_samplers.py                      # the full run
    python benchmarks/bench_samplers.py --seeds 3 --dims 2 10 --trials 120 --timing-sizes 1000

It prints a Markdown table and writes it, with the raw numbers, under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


# -- test functions: (domain half-width or (low, high), function of a numpy vector) ---------


def sphere(x: np.ndarray) -> float:
    return float(np.sum(x**2))


def rosenbrock(x: np.ndarray) -> float:
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def rastrigin(x: np.ndarray) -> float:
    return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))


def ackley(x: np.ndarray) -> float:
    d = len(x)
    return float(
        -20 * np.exp(-0.2 * np.sqrt(np.sum(x**2) / d))
        - np.exp(np.sum(np.cos(2 * np.pi * x)) / d)
        + 20
        + math.e
    )


def styblinski_tang(x: np.ndarray) -> float:
    # Shifted by its minimum (-39.16617 per dimension) so that 0 is the optimum everywhere.
    return float(np.sum(x**4 - 16 * x**2 + 5 * x) / 2 + 39.16616570377142 * len(x))


FUNCTIONS: dict[str, tuple[tuple[float, float], Callable[[np.ndarray], float], bool]] = {
    # name: (domain, function, multimodal)
    "sphere": ((-5.12, 5.12), sphere, False),
    "rosenbrock": ((-5.0, 10.0), rosenbrock, False),
    "rastrigin": ((-5.12, 5.12), rastrigin, True),
    "ackley": ((-32.768, 32.768), ackley, True),
    "styblinski_tang": ((-5.0, 5.0), styblinski_tang, True),
}

SAMPLERS = ("pso", "random", "qmc", "tpe", "cmaes")


def make(name: str, seed: int):
    import optuna

    from samplers import PSOSampler

    if name == "pso":
        return PSOSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(f"unknown sampler {name!r}: choose from {', '.join(SAMPLERS)}")


def run_once(
    sampler: str, function: str, dim: int, seed: int, trials: int, in_flight: int
) -> float:
    """The best value one sampler finds in `trials` trials, `in_flight` at a time."""
    import optuna

    (low, high), f, _ = FUNCTIONS[function]
    study = optuna.create_study(sampler=make(sampler, seed))
    finish = np.random.default_rng([seed, 7])
    running: list[tuple[float, int, optuna.Trial, float]] = []
    clock, asked, best = 0.0, 0, math.inf

    def ask() -> None:
        nonlocal asked
        trial = study.ask()
        x = np.array([trial.suggest_float(f"x{i}", low, high) for i in range(dim)])
        heapq.heappush(running, (clock + finish.exponential(1.0), asked, trial, f(x)))
        asked += 1

    while asked < min(in_flight, trials):
        ask()
    while running:
        clock, _, trial, value = heapq.heappop(running)
        study.tell(trial, value)
        best = min(best, value)
        if asked < trials:
            ask()
    return best


def time_per_trial(
    sampler: str, size: int, dim: int = 10, repeats: int = 20
) -> tuple[float, float]:
    """Mean seconds (warm, cold) for ask + suggest + tell when the study holds `size` trials.

    The study is filled with `size` complete trials at random points; for PSOSampler they carry
    the particle records its own trials would have, so it rebuilds a real swarm of that size.
    """
    import optuna
    from optuna.distributions import FloatDistribution

    rng = np.random.default_rng(size)
    distributions = {f"x{i}": FloatDistribution(-5.12, 5.12) for i in range(dim)}
    trials = []
    for number in range(size):
        params = {name: float(rng.uniform(-5.12, 5.12)) for name in distributions}
        system_attrs = {}
        if sampler == "pso":
            record = {
                name: [(v + 5.12) / 10.24, float(rng.uniform(-0.1, 0.1))]
                for name, v in params.items()
            }
            system_attrs = {"pso": {"p": number % 20, "x": record}}
        trials.append(
            optuna.trial.create_trial(
                params=params,
                distributions=distributions,
                value=sphere(np.array(list(params.values()))),
                system_attrs=system_attrs,
            )
        )
    study = optuna.create_study(sampler=make(sampler, 0))
    study.add_trials(trials)

    def one_trial() -> None:
        trial = study.ask()
        x = np.array([trial.suggest_float(name, -5.12, 5.12) for name in distributions])
        study.tell(trial, sphere(x))

    one_trial()  # warm-up: caches filled, as in a long-running optimize loop
    start = time.perf_counter()
    for _ in range(repeats):
        one_trial()
    warm = (time.perf_counter() - start) / repeats
    # Cold: a new sampler object per trial, as the orchestrator's one-process-per-trial does.
    start = time.perf_counter()
    for _ in range(3):
        study.sampler = make(sampler, 0)
        one_trial()
    return warm, (time.perf_counter() - start) / 3


def _job(args: tuple) -> tuple[tuple, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return args, run_once(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS), choices=list(FUNCTIONS))
    parser.add_argument("--dims", nargs="+", type=int, default=[2, 5, 10, 20])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=100,
        help="seeds are first..first+N-1 (defaults were tuned on 0-2)",
    )
    parser.add_argument("--trials", type=int, default=200, help="budget per run")
    parser.add_argument("--in-flight", type=int, default=8, help="trials running at once")
    parser.add_argument("--timing-sizes", nargs="*", type=int, default=[1000, 10000])
    parser.add_argument("--processes", type=int, default=1, help="runs in parallel")
    parser.add_argument("--out", default="samplers", help="results file name (no extension)")
    args = parser.parse_args(argv)

    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    jobs = [
        (sampler, function, dim, seed, args.trials, args.in_flight)
        for function in args.functions
        for dim in args.dims
        for sampler in args.samplers
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    started = time.perf_counter()
    if args.processes > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
            results = pool.map(_job, jobs, chunksize=1)
    else:
        results = [_job(job) for job in jobs]
    quality_seconds = time.perf_counter() - started
    best: dict[tuple[str, int, str], list[float]] = {}
    for (sampler, function, dim, _seed, _, _), value in results:
        best.setdefault((function, dim, sampler), []).append(value)
    medians = {key: statistics.median(values) for key, values in best.items()}

    timings: dict[str, dict[int, tuple[float, float]]] = {}
    for sampler in args.samplers:
        for size in args.timing_sizes:
            timings.setdefault(sampler, {})[size] = time_per_trial(sampler, size)

    table = render(args, medians, timings, quality_seconds)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(table)
    raw = {
        "command": " ".join(["python", "benchmarks/bench_samplers.py", *(argv or sys.argv[1:])]),
        "settings": vars(args),
        "best": {f"{f}/{d}/{s}": values for (f, d, s), values in best.items()},
        "median_best": {f"{f}/{d}/{s}": value for (f, d, s), value in medians.items()},
        "seconds_per_trial": timings,
        "quality_seconds": quality_seconds,
    }
    (RESULTS / f"{args.out}.json").write_text(json.dumps(raw, indent=1))
    return 0


def render(args, medians, timings, quality_seconds: float) -> str:
    samplers = args.samplers
    command = " ".join(["python benchmarks/bench_samplers.py", *sys.argv[1:]])
    lines = [
        f"Command: `{command}`",
        "",
        f"Median best value over {args.seeds} seeds, {args.trials} trials, {args.in_flight} in "
        "flight; lower is better, 0 is the optimum of every function (Styblinski-Tang shifted). "
        f"**Bold**: the best median of the row. Quality runs took {quality_seconds:.0f} s.",
        "",
        "| function | dim | " + " | ".join(samplers) + " | PSO rank |",
        "|---|---:|" + "---:|" * len(samplers) + "---:|",
    ]
    for function in args.functions:
        for dim in args.dims:
            row = [medians[(function, dim, s)] for s in samplers]
            low = min(row)
            cells = [f"**{v:.3g}**" if v == low else f"{v:.3g}" for v in row]
            rank = ""
            if "pso" in samplers:
                rank = str(1 + sum(v < medians[(function, dim, "pso")] for v in row))
            lines.append(f"| {function} | {dim} | " + " | ".join(cells) + f" | {rank} |")
    if timings:
        sizes = sorted({size for per in timings.values() for size in per})
        lines += [
            "",
            "Sampler's own time per trial (ask + suggest 10 floats + tell, in memory), in ms, "
            "with the study already holding N trials. Warm: one sampler object for every trial "
            "(`study.optimize`). Cold: a new sampler object per trial, as each trial process "
            "of the orchestrator builds one.",
            "",
            "| sampler | "
            + " | ".join(f"warm, {size:,} | cold, {size:,}" for size in sizes)
            + " |",
            "|---|" + "---:|" * (2 * len(sizes)),
        ]
        for sampler, per in timings.items():
            cells = [f"{per[size][0] * 1000:.1f} | {per[size][1] * 1000:.1f}" for size in sizes]
            lines.append(f"| {sampler} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
