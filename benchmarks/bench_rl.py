"""How fast our DQN and PPO learn, against stable-baselines3, and how they do on the trading env.

CartPole-v1: each agent trains until the greedy policy's mean return over 10 evaluation
episodes (the same `mean_eval_return`, same seeds, for every agent) reaches `--target`, or
until `--max-steps` environment steps. Evaluation runs every `--eval-every` steps and its time
is not counted. Reported per agent: training environment steps per second (steps / training
seconds), the steps and training seconds at which the target was first reached, and the best
evaluation return. Ours run with their default parameters; stable-baselines3 runs with the
RL Zoo's tuned CartPole-v1 settings (its best known, so the comparison is not against a
strawman).

Trading (synthetic mixed regimes, seed 0): our agents with their defaults for `epochs` x
`steps_per_epoch` (the same as one default trial), with the held-out Sharpe ratio after each
epoch, beside three fixed policies for scale: random, always long, and a momentum rule (long
when the mean of the last 32 returns is positive, short otherwise).

Every agent runs with one torch thread, as a trial process would. Needs
`pip install stable-baselines3` (the `bench` extra); without it, those rows are skipped.

    python benchmarks/bench_rl.py                     # the full run, about 10 minutes on 2 cores
    python benchmarks/bench_rl.py --seeds 0 1 --max-steps 50000   # what results/rl.md holds

It prints a Markdown table and writes it, with the command, to benchmarks/results/rl.md.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"
ENV_ID = "CartPole-v1"


class TargetReached(Exception):
    """Raised from a report callback to end a run once the target return is reached."""


class Clock:
    """Training time: wall time minus the time spent evaluating."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.eval_seconds = 0.0

    def training_seconds(self) -> float:
        return time.perf_counter() - self.started - self.eval_seconds


class TimedTask:
    """A task whose evaluations are timed, so that they can be left out of training time."""

    def __init__(self, task: Any, clock: Clock) -> None:
        self._task, self._clock = task, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def evaluate(self, *args: Any, **kwargs: Any) -> float:
        started = time.perf_counter()
        try:
            return self._task.evaluate(*args, **kwargs)
        finally:
            self._clock.eval_seconds += time.perf_counter() - started


def run_ours(algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from adapters import _rl, dqn, ppo

    module, config = (dqn, dqn.DQNConfig()) if algo == "dqn" else (ppo, ppo.PPOConfig())
    clock = Clock()
    task = TimedTask(_rl.load_task({"env": ENV_ID, "seed": seed}), clock)
    curve: list[tuple[int, float, float]] = []
    reached: dict[float, tuple[int, float]] = {}

    def report(epoch: int, value: float) -> None:
        steps = (epoch + 1) * args.eval_every
        curve.append((steps, clock.training_seconds(), value))
        if _note_targets(reached, args.targets, steps, clock.training_seconds(), value):
            raise TargetReached

    epochs = args.max_steps // args.eval_every
    with contextlib.suppress(TargetReached):
        module.learn(
            config,
            task,
            epochs=epochs,
            steps_per_epoch=args.eval_every,
            device=torch.device("cpu"),
            report=report,
        )
    return _summary(f"ours {algo.upper()}", seed, curve, reached)


def run_sb3(algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        import stable_baselines3 as sb3
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return None
    import torch

    from adapters import _rl

    clock = Clock()
    curve: list[tuple[int, float, float]] = []
    reached: dict[float, tuple[int, float]] = {}
    # RL Zoo's tuned CartPole-v1 hyperparameters (rl-baselines3-zoo, hyperparams/{dqn,ppo}.yml).
    if algo == "dqn":
        env = make_vec_env(ENV_ID, n_envs=1, seed=seed)
        model = sb3.DQN(
            "MlpPolicy",
            env,
            learning_rate=2.3e-3,
            batch_size=64,
            buffer_size=100_000,
            learning_starts=1_000,
            gamma=0.99,
            target_update_interval=10,
            train_freq=256,
            gradient_steps=128,
            exploration_fraction=0.16,
            exploration_final_eps=0.04,
            policy_kwargs={"net_arch": [256, 256]},
            seed=seed,
            device="cpu",
        )
    else:
        env = make_vec_env(ENV_ID, n_envs=8, seed=seed)
        model = sb3.PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=lambda progress: 1e-3 * progress,
            clip_range=lambda progress: 0.2 * progress,
            seed=seed,
            device="cpu",
        )

    def policy(obs: torch.Tensor) -> torch.Tensor:
        actions, _ = model.predict(obs.cpu().numpy(), deterministic=True)
        return torch.as_tensor(actions)

    class Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += args.eval_every
            started = time.perf_counter()
            value = _rl.mean_eval_return(
                ENV_ID, policy, torch.device("cpu"), seed=seed + _rl.EVAL_SEED_OFFSET
            )
            clock.eval_seconds += time.perf_counter() - started
            curve.append((self.num_timesteps, clock.training_seconds(), value))
            seconds = clock.training_seconds()
            return not _note_targets(reached, args.targets, self.num_timesteps, seconds, value)

    clock.started = time.perf_counter()
    model.learn(total_timesteps=args.max_steps, callback=Evaluate())
    env.close()
    return _summary(f"stable-baselines3 {algo.upper()}", seed, curve, reached)


def _note_targets(
    reached: dict[float, tuple[int, float]],
    targets: list[float],
    steps: int,
    seconds: float,
    value: float,
) -> bool:
    """Record the first time each target is reached; True once the highest one is."""
    for target in targets:
        if value >= target and target not in reached:
            reached[target] = (steps, seconds)
    return max(targets) in reached


def _summary(
    agent: str, seed: int, curve: list, reached: dict[float, tuple[int, float]]
) -> dict[str, Any]:
    steps, seconds, _ = curve[-1]
    return {
        "agent": agent,
        "seed": seed,
        "steps_per_second": steps / max(seconds, 1e-9),
        "reached": reached,  # target -> (steps, training seconds)
        "best_return": max(value for _, _, value in curve),
        "curve": curve,
    }


def run_trading(algo: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from adapters import _rl, dqn, ppo

    module, config = (dqn, dqn.DQNConfig()) if algo == "dqn" else (ppo, ppo.PPOConfig())
    steps_per_epoch = (dqn if algo == "dqn" else ppo).adapter.options["steps_per_epoch"]
    clock = Clock()
    task = TimedTask(_rl.load_task({"env": "trading", "seed": 0}), clock)
    history: list[float] = []
    module.learn(
        config,
        task,
        epochs=args.trading_epochs,
        steps_per_epoch=steps_per_epoch,
        device=torch.device("cpu"),
        report=lambda epoch, value: history.append(value),
    )
    seconds = clock.training_seconds()
    steps = args.trading_epochs * steps_per_epoch
    return {
        "agent": f"ours {algo.upper()}",
        "steps": steps,
        "steps_per_second": steps / seconds,
        "training_seconds": seconds,
        "eval_seconds": clock.eval_seconds,
        "sharpe_by_epoch": history,
    }


def fixed_policies() -> dict[str, float]:
    import torch

    from adapters import _rl
    from adapters.envs import BUY, SELL

    task = _rl.load_task({"env": "trading", "seed": 0})
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    random = [
        task.evaluate(lambda o: torch.randint(3, (o.shape[0],), generator=generator), cpu)
        for _ in range(10)
    ]
    return {
        "random (mean of 10)": statistics.mean(random),
        "always long": task.evaluate(lambda o: torch.full((o.shape[0],), BUY), cpu),
        "momentum rule": task.evaluate(
            lambda o: torch.where(o[:, : _rl.WINDOW].mean(dim=1) > 0, BUY, SELL), cpu
        ),
    }


def markdown(results: dict[str, Any], command: str) -> str:
    a = results["args"]
    lines = [
        "# RL benchmark: our DQN and PPO against stable-baselines3, and on the trading env",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {results['machine']}; torch {results['torch']}, one torch thread per agent; "
        f"stable-baselines3 {results['sb3'] or 'not installed'}.",
        "",
        f"## {ENV_ID}: steps and training time to a mean evaluation return",
        "",
        f"Evaluation every {a['eval_every']:,} steps (10 greedy episodes, not timed), "
        f"at most {a['max_steps']:,} steps; seeds {a['seeds']}. Medians over the seeds that "
        "reached the target (how many did is in brackets).",
        "",
        "| agent | env steps/s | "
        + " | ".join(f"steps to {t:g} | seconds to {t:g}" for t in a["targets"])
        + " | best eval return |",
        "|---|---:|" + "---:|---:|" * len(a["targets"]) + "---:|",
    ]
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for row in results["cartpole"]:
        by_agent.setdefault(row["agent"], []).append(row)
    for agent, rows in by_agent.items():
        cells = [f"{statistics.median(r['steps_per_second'] for r in rows):,.0f}"]
        for target in a["targets"]:
            hits = [r["reached"][target] for r in rows if target in r["reached"]]
            if not hits:
                cells += ["not reached", "not reached"]
                continue
            share = f" ({len(hits)}/{len(rows)})"
            cells.append(f"{statistics.median(h[0] for h in hits):,.0f}{share}")
            cells.append(f"{statistics.median(h[1] for h in hits):.1f}{share}")
        best = statistics.median(r["best_return"] for r in rows)
        lines.append(f"| {agent} | " + " | ".join(cells) + f" | {best:.1f} |")
    lines += [
        "",
        f"## Trading (synthetic, mixed regimes, seed 0): one default trial of {a['trading_epochs']} epochs",
        "",
        "| agent | env steps | env steps/s | training s | eval s | held-out Sharpe by epoch |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in results["trading"]:
        sharpes = ", ".join(f"{v:.2f}" for v in row["sharpe_by_epoch"])
        lines.append(
            f"| {row['agent']} | {row['steps']:,} | {row['steps_per_second']:,.0f} | "
            f"{row['training_seconds']:.1f} | {row['eval_seconds']:.1f} | {sharpes} |"
        )
    lines += ["", "Fixed policies on the same held-out prices, for scale:", ""]
    lines += [f"- {name}: Sharpe {value:.2f}" for name, value in results["fixed"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--targets", type=float, nargs="+", default=[195.0, 475.0])
    parser.add_argument("--max-steps", type=int, default=60_000)
    parser.add_argument("--eval-every", type=int, default=2_000)
    parser.add_argument("--trading-epochs", type=int, default=8)
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    # Pay the optimiser's one-off import (about 2 s) before any clock starts.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    try:
        import stable_baselines3

        sb3_version = None if args.skip_sb3 else stable_baselines3.__version__
    except ImportError:
        sb3_version = None

    cartpole = []
    for seed in args.seeds:
        for algo in ("dqn", "ppo"):
            for runner in (run_ours, run_sb3):
                if runner is run_sb3 and sb3_version is None:
                    continue
                row = runner(algo, seed, args)
                if row is not None:
                    cartpole.append(row)
                    print(
                        f"{row['agent']:>24} seed {seed}: {row['steps_per_second']:,.0f} steps/s, "
                        f"targets reached (steps, s): {row['reached']}, best {row['best_return']:.1f}",
                        flush=True,
                    )
    trading = []
    for algo in ("dqn", "ppo"):
        trading.append(run_trading(algo, args))
        print(f"trading {algo}: {trading[-1]}", flush=True)
    results = {
        "args": vars(args),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"{__import__('os').cpu_count()} cores, Python {platform.python_version()}",
        "torch": torch.__version__,
        "sb3": sb3_version,
        "cartpole": cartpole,
        "trading": trading,
        "fixed": fixed_policies(),
    }
    command = "python benchmarks/bench_rl.py" + (f" {' '.join(argv)}" if argv else "")
    if argv is None and len(sys.argv) > 1:
        command = "python benchmarks/bench_rl.py " + " ".join(sys.argv[1:])
    table = markdown(results, command)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rl.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
