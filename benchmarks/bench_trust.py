"""How far a study's selected value can be trusted: validation, confirmed on seeds, test, baselines.

For each (adapter, environment) a real study runs with the adapter's own objective and the
study's sampler (the particle swarm), sequentially in this process; then the scoring that
`run --confirm K` does at the end of a study (`orchestrator.selection.score_selection`) re-runs
the top K trials on more seeds, tests the first on the part no trial saw, and scores the
baselines on the same parts. Printed as a table, written to benchmarks/results/trust.json.

    python benchmarks/bench_trust.py                      # dqn and ppo, trading and CartPole
    python benchmarks/bench_trust.py --only dqn:trading --trials 12 --confirm 3 --seeds 3
    python benchmarks/bench_trust.py --only dqn:trading --regime mean_reversion

The rows answer: how much of the selected value survives other seeds (confirmed mean +- std),
and does the agent beat what needs no learning (buy-and-hold, a random policy) on the test part?
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "trust.json"
CASES = ("dqn:trading", "ppo:trading", "dqn:CartPole-v1", "ppo:CartPole-v1")


def run_case(
    case: str, *, trials: int, epochs: int, confirm: int, seeds: int, regime: str, seed: int
) -> dict:
    import optuna
    import torch

    import adapters
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.selection import score_selection
    from samplers import make_sampler

    name, env = case.split(":")
    adapter = adapters.get(name)
    options = {**adapter.options, "env": env, "seed": seed}
    if env == "trading":
        options["regime"] = regime
    spec = StudySpec(
        adapter=name, trials=trials, epochs=epochs, direction="maximize", options=options
    )
    cpu = torch.device("cpu")
    torch.set_num_threads(1)
    started = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=make_sampler("pso", seed=seed))
    study.optimize(lambda t: adapter.objective(t, cpu, epochs, options), n_trials=trials)
    values = sorted(t.value for t in study.trials if t.value is not None)
    scores = score_selection(study, spec, adapter, cpu, top=confirm, seeds=seeds)
    assert scores is not None
    first = scores.confirmed[0] if scores.confirmed else None
    return {
        "case": case if env != "trading" else f"{case}:{regime}",
        "command": " ".join(sys.argv),
        "trials": trials,
        "epochs": epochs,
        "seed": seed,
        "selected_trial": scores.selected_trial,
        "selected_validation": scores.validation,
        "median_trial_validation": values[len(values) // 2],
        "confirmed_mean": first.mean if first else None,
        "confirmed_std": first.std if first else None,
        "confirm_seeds": seeds if first else 0,
        "test": scores.test,
        "test_std": scores.test_std,
        "baselines": scores.baselines,
        "minutes": (time.perf_counter() - started) / 60,
    }


def table(rows: list[dict]) -> str:
    head = (
        "| task | selected (validation) | median trial | confirmed mean +- std | test | "
        "buy-and-hold val / test | random val / test |"
    )
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        b = r["baselines"]
        bh = b.get("buy_and_hold")
        rnd = b.get("random", {})
        conf = (
            f"{r['confirmed_mean']:.3g} +- {r['confirmed_std']:.2g} ({r['confirm_seeds']} seeds)"
            if r["confirmed_mean"] is not None
            else "-"
        )
        test = "-" if r["test"] is None else f"{r['test']:.3g}"
        if r["test_std"] and r["confirm_seeds"]:
            test += f" +- {r['test_std']:.2g}"
        lines.append(
            f"| {r['case']} | {r['selected_validation']:.3g} (#{r['selected_trial']}) | "
            f"{r['median_trial_validation']:.3g} | {conf} | {test} | "
            + (f"{bh['validation']:.3g} / {bh['test']:.3g}" if bh else "-")
            + f" | {rnd.get('validation', float('nan')):.3g} / {rnd.get('test', float('nan')):.3g} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=CASES, help="one case (repeatable)")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--confirm", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regime", default="mixed")
    args = parser.parse_args()
    rows = [
        run_case(
            case,
            trials=args.trials,
            epochs=args.epochs,
            confirm=args.confirm,
            seeds=args.seeds,
            regime=args.regime,
            seed=args.seed,
        )
        for case in (args.only or CASES)
    ]
    print(table(rows))
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    done = {(r["case"], r["seed"]) for r in rows}
    kept = [r for r in kept if (r["case"], r["seed"]) not in done] + rows
    RESULTS.write_text(json.dumps(kept, indent=2) + "\n")


if __name__ == "__main__":
    main()
