"""Population-based training against the swarm with the median pruner and against Hyperband,
at equal total epochs.

Each study is a real `python -m orchestrator run` (its own SQLite file and artifact folder,
trial processes, checkpoints), of DQN and PPO on CartPole-v1, Acrobot-v1 and the trading
environment, for each seed:

- pbt: `--sampler pbt`, a population of P members, lineages of E epochs in segments of a
  quarter of E (rounded up), so P x 4 trials and P x E epochs trained;
- swarm + median: `--sampler pso --pruner median`, the swarm of P particles;
- hyperband: `--sampler pso --pruner hyperband`.

Equal total epochs: the two pruned studies run 2 x P trials of E epochs (pruning ends many
early), and are then read in the order their trials finished, up to the trial at which the
epochs they trained reach P x E (the pbt study's epochs); their score is the best value among
those trials. The epochs each method really trained are in the table. The score is the study's
own value: the mean evaluation return (Gymnasium) or the validation score (trading) that the
trial reported at its last epoch. For PBT that value belongs to weights trained under a schedule
of params, kept as the lineage's checkpoint.

    python benchmarks/bench_pbt.py                    # --size small: a few minutes a study
    python benchmarks/bench_pbt.py --size medium --seeds 0 1 2
    python benchmarks/bench_pbt.py --only dqn:CartPole-v1

Every study appends a line to benchmarks/results/pbt.jsonl as it ends (a stopped run resumes
where it was); the table goes to stdout and benchmarks/results/pbt.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

# population, epochs of a lineage, environment steps per epoch; a segment is a quarter of the
# epochs, rounded up (what `run --sampler pbt` does)
SIZES = {
    "small": {"population": 3, "epochs": 4, "steps_per_epoch": 1_000},
    "medium": {"population": 8, "epochs": 8, "steps_per_epoch": 5_000},
    "full": {"population": 16, "epochs": 20, "steps_per_epoch": 12_000},
}
TASKS = ("CartPole-v1", "Acrobot-v1", "trading")
ALGOS = ("dqn", "ppo")
METHODS = {
    "pbt": ("--sampler", "pbt", "--pruner", "none"),
    "swarm + median": ("--sampler", "pso", "--pruner", "median"),
    "hyperband": ("--sampler", "pso", "--pruner", "hyperband"),
}


def run_study(
    algo: str, task: str, seed: int, method: str, size: dict[str, int], args: Any
) -> dict:
    """One study, run to its end; what it trained and the best value within the equal budget."""
    import optuna

    from orchestrator.record.study.final_scores import final_scores_of
    from samplers._pbt_rules import default_interval

    population, epochs = size["population"], size["epochs"]
    budget = population * epochs
    interval = default_interval(epochs)
    trials = population * -(-epochs // interval) if method == "pbt" else 2 * population
    with tempfile.TemporaryDirectory(prefix="bench-pbt-") as folder:
        url = f"sqlite:///{folder}/study.db"
        command = [
            sys.executable, "-m", "orchestrator", "run", algo,
            "--env", task,
            "--option", f"steps_per_epoch={size['steps_per_epoch']}",
            "--option", f"seed={seed}",
            "--seed", str(seed),
            "--study", "bench",
            "--storage", url,
            "--trials", str(trials),
            "--epochs", str(epochs),
            "--swarm-size", str(population),
            "--gpus", args.gpus,
            "--concurrency", str(args.concurrency),
            "--quiet",
            *METHODS[method],
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=folder, check=False)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        study = optuna.load_study(study_name="bench", storage=url)
        found = within_budget(study.trials, budget, maximize=True)
        final = final_scores_of(study.user_attrs)  # the study's best, scored by `run` at its end
    return {
        "algo": algo, "task": task, "seed": seed, "method": method, "size": args.size,
        "trials": found["trials"], "epochs": found["epochs"], "best": found["best"],
        "seconds": round(seconds, 1), "final_scores": None if final is None else final.as_dict(),
    }  # fmt: skip


def trained_epochs(trial: Any) -> int:
    """Epochs the trial trained itself: a PBT segment's curve starts with its parent's."""
    start = trial.user_attrs.get("pbt_start_epoch", 0) or 0
    return max(0, len(trial.intermediate_values) - start)


def within_budget(trials: list[Any], budget: int, *, maximize: bool) -> dict[str, Any]:
    """The best value among the trials, in the order they finished, until their epochs reach
    `budget` (the trial that reaches it counts); and how many trials and epochs that was."""
    from optuna.trial import TrialState

    finished = sorted(
        (t for t in trials if t.datetime_complete is not None),
        key=lambda t: (t.datetime_complete, t.number),
    )
    best, epochs, count = None, 0, 0
    for trial in finished:
        if epochs >= budget:
            break
        epochs += trained_epochs(trial)
        count += 1
        value = trial.value if trial.state == TrialState.COMPLETE else None
        if value is not None and (best is None or (value > best if maximize else value < best)):
            best = value
    return {"best": best, "epochs": epochs, "trials": count}


def table(rows: list[dict[str, Any]], size: str) -> list[str]:
    """One line per (algorithm, task): each method's median best over seeds, its epochs, and the
    winner; then the count of tasks PBT won."""
    lines = [
        f"| algorithm | task | {' | '.join(METHODS)} | epochs (pbt / median / hyperband) "
        "| seeds | best |",
        "|---|---|" + "---|" * len(METHODS) + "---|---|---|",
    ]
    wins: dict[str, list[str]] = {}
    for algo in ALGOS:
        for task in TASKS:
            mine = [
                r for r in rows if r["algo"] == algo and r["task"] == task and r["size"] == size
            ]
            if not mine:
                continue
            medians, epochs, seeds = {}, {}, set()
            for method in METHODS:
                found = [r for r in mine if r["method"] == method and r["best"] is not None]
                seeds |= {r["seed"] for r in found}
                medians[method] = statistics.median(r["best"] for r in found) if found else None
                epochs[method] = statistics.median(r["epochs"] for r in found) if found else None
            ranked = [m for m in METHODS if medians[m] is not None]
            top = max((medians[m] for m in ranked), default=None)
            leaders = [m for m in ranked if medians[m] == top]
            # A tie is nobody's win (at the small size an agent that learnt nothing scores alike).
            winner = leaders[0] if len(leaders) == 1 else "tie (" + ", ".join(leaders) + ")"
            wins.setdefault(task, []).append(winner)
            cells = [f"{medians[m]:.1f}" if medians[m] is not None else "-" for m in METHODS]
            spent = " / ".join(
                f"{epochs[m]:.0f}" if epochs[m] is not None else "-" for m in METHODS
            )
            lines.append(
                f"| {algo} | {task} | {' | '.join(cells)} | {spent} | {len(seeds)} | {winner} |"
            )
    won = sorted(task for task, winners in wins.items() if winners.count("pbt") > len(winners) / 2)
    # A task is PBT's when it is best for most of the algorithms run on it.
    lines.append("")
    lines.append(
        f"PBT best on {len(won)} of {len(wins)} tasks (best for most of the algorithms on a task): "
        f"{', '.join(won) or 'none'}."
    )
    return lines


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", metavar="ALGO:TASK", help="e.g. dqn:CartPole-v1")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--gpus", default="none", help="passed to run (default none: CPU)")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once")
    parser.add_argument("--results", type=Path, default=RESULTS / "pbt.jsonl")
    parser.add_argument("--table-only", action="store_true", help="print the stored results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    size = SIZES[args.size]
    args.results.parent.mkdir(parents=True, exist_ok=True)
    rows = load(args.results)
    done = {(r["algo"], r["task"], r["seed"], r["method"], r["size"]) for r in rows}
    pairs = [(a, t) for a in ALGOS for t in TASKS]
    if args.only:
        pairs = [tuple(item.split(":", 1)) for item in args.only]  # type: ignore[misc]
    for seed in [] if args.table_only else args.seeds:
        for algo, task in pairs:
            for method in args.methods:
                if (algo, task, seed, method, args.size) in done:
                    continue
                row = run_study(algo, task, seed, method, size, args)
                print(json.dumps(row), flush=True)
                with args.results.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                rows.append(row)
    command = "python benchmarks/bench_pbt.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    settings = ", ".join(f"{k} {v}" for k, v in size.items())
    text = [
        f"# PBT against the swarm with the median pruner and Hyperband ({args.size}: {settings})",
        "",
        f"`{command.strip()}`",
        "",
        "Median over seeds of the best value within equal total epochs (return: higher is "
        "better; trading: the validation score).",
        "",
        *table(rows, args.size),
    ]
    print("\n".join(text))
    (RESULTS / "pbt.md").write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
