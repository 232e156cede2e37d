"""Our DQN and PPO against stable-baselines3 at the same work, and ours on the trading env.

Like for like. Each stable-baselines3 (SB3) row marked "same work" is set to the work our
defaults do: the same number of environments (8), the same hidden layers, batch size, gradient
steps per environment step, rollout length and passes (PPO), target-copy period, exploration
schedule, learning rate and discount, and the same replay kind: SB3 has no prioritised replay,
so the matched DQN row of ours uses uniform n-step replay (`per_alpha=0`), as SB3's n-step
buffer does. Ours still does a little more per gradient step (double DQN's extra forward pass,
a dueling head). Our prioritised defaults get a row of their own, beside SB3's RL Zoo settings
(`--zoo`), which do far more work per step and are not a speed comparison.

Every agent trains for the same number of environment steps (`--max-steps` on CartPole-v1,
`--acrobot-steps` on Acrobot-v1; the true count, read from the environments), whether or not
it reached a target on the way; the greedy policy is scored every `--eval-every` (or
`--acrobot-eval-every`) steps on the same 10 evaluation episodes (`_rl.mean_eval_return`,
same seeds) and that time is left out. Reported: training env steps per CPU second and per
wall second, steps and training CPU seconds to each target return (195 and 475 on CartPole-v1,
-100 on Acrobot-v1), and the final evaluation. Seeds run in turn, and within a seed ours and
SB3's alternate, so both see the same load; the speed ratio is the median over seeds of
ours / SB3 measured back to back. CPU time (this process's) is the headline: on a machine
shared with other work, wall time also counts whatever ran while the process waited for a core.

Trading: our environment (vectorised in torch) with 8, 64 and 512 environments: the
environment alone (random actions), and a whole DQN and PPO training run of `--trading-steps`
steps at their defaults (the work per environment step does not change with the number of
environments: the same gradient steps per step), interleaved over `--reps` repetitions,
medians of env steps per CPU second.

Every agent runs with one torch thread, as a trial process does. SB3 is the `bench` extra.

    python benchmarks/bench_rl.py                      # what results/rl.md holds
    python benchmarks/bench_rl.py --zoo                # also SB3 with the RL Zoo's settings
    python benchmarks/bench_rl.py --only trading       # one part: cartpole, acrobot or trading

It prints Markdown tables and writes them with the command to benchmarks/results/rl.md, and
every measurement to benchmarks/results/rl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"CartPole-v1": [195.0, 475.0], "Acrobot-v1": [-100.0]}
PARTS = {"cartpole": "CartPole-v1", "acrobot": "Acrobot-v1"}


@dataclass
class Curve:
    """One training run: at every score, (true env steps, training wall seconds, training CPU
    seconds, evaluation return)."""

    agent: str
    env_id: str
    seed: int
    points: list[tuple[int, float, float, float]] = field(default_factory=list)

    def steps_per_second(self, cpu: bool = True) -> float:
        steps, wall, cpu_seconds, _ = self.points[-1]
        return steps / max(cpu_seconds if cpu else wall, 1e-9)

    def first_reaching(self, target: float) -> tuple[int, float] | None:
        """(env steps, training CPU seconds) at the first score of at least `target`."""
        for steps, _, cpu_seconds, value in self.points:
            if value >= target:
                return steps, cpu_seconds
        return None


class Clock:
    """Training time, wall and CPU (this process), both less the time spent evaluating.

    On a machine shared with other work the CPU time is what the training itself cost: the
    wall time also counts whatever else ran while this process waited for a core.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.started_cpu = time.process_time()
        self.eval_seconds = self.eval_cpu_seconds = 0.0

    def training_seconds(self) -> tuple[float, float]:
        wall = time.perf_counter() - self.started - self.eval_seconds
        return wall, time.process_time() - self.started_cpu - self.eval_cpu_seconds

    def leave_out(self, wall: float, cpu: float) -> None:
        self.eval_seconds += time.perf_counter() - wall
        self.eval_cpu_seconds += time.process_time() - cpu


class CountedEnv:
    """An environment that counts the steps it really took (PPO rolls out whole rollouts)."""

    def __init__(self, env: Any) -> None:
        self._env, self.steps = env, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def step(self, actions: Any) -> Any:
        self.steps += self._env.num_envs
        return self._env.step(actions)


class BenchTask:
    """A task whose evaluations are timed (to leave them out) and whose env steps are counted."""

    def __init__(self, task: Any, clock: Clock) -> None:
        self._task, self._clock, self.env = task, clock, None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def make_env(self, *args: Any, **kwargs: Any) -> CountedEnv:
        self.env = CountedEnv(self._task.make_env(*args, **kwargs))
        return self.env

    def evaluate(self, *args: Any, **kwargs: Any) -> float:
        started, started_cpu = time.perf_counter(), time.process_time()
        try:
            return self._task.evaluate(*args, **kwargs)
        finally:
            self._clock.leave_out(started, started_cpu)


def default_config(algo: str) -> Any:
    from adapters import dqn, ppo

    return dqn.DQNConfig() if algo == "dqn" else ppo.PPOConfig()


def run_ours(
    algo: str, env_id: str, seed: int, args: argparse.Namespace, overrides: dict[str, Any]
) -> Curve:
    import torch

    from adapters import dqn, ppo
    from adapters._rl import frame as _rl

    module = dqn if algo == "dqn" else ppo
    config = replace(default_config(algo), **overrides)
    clock = Clock()
    task = BenchTask(_rl.load_task({"env": env_id, "seed": seed}), clock)
    curve = Curve("", env_id, seed)

    def report(epoch: int, value: float) -> None:
        curve.points.append((task.env.steps, *clock.training_seconds(), value))

    module.learn(
        config,
        task,
        epochs=args.max_steps // args.eval_every,
        steps_per_epoch=args.eval_every,
        device=torch.device("cpu"),
        report=report,
    )
    return curve


def sb3_dqn(env: Any, seed: int, args: argparse.Namespace, zoo: bool) -> Any:
    import stable_baselines3 as sb3

    if zoo:  # rl-baselines3-zoo, hyperparams/dqn.yml, CartPole-v1 (with n_envs=1)
        settings: dict[str, Any] = {
            "learning_rate": 2.3e-3,
            "batch_size": 64,
            "buffer_size": 100_000,
            "learning_starts": 1_000,
            "gamma": 0.99,
            "target_update_interval": 10,
            "train_freq": 256,
            "gradient_steps": 128,
            "exploration_fraction": 0.16,
            "exploration_final_eps": 0.04,
            "policy_kwargs": {"net_arch": [256, 256]},
        }
    else:
        c = default_config("dqn")
        gradient_steps = c.replay_ratio * c.num_envs / c.batch_size
        assert gradient_steps == int(gradient_steps), "SB3 needs whole gradient steps per step"
        settings = {
            "learning_rate": c.learning_rate,
            "batch_size": c.batch_size,
            "buffer_size": c.buffer_size,
            # As ours: learning starts within the first quarter of the first epoch at the latest.
            "learning_starts": min(c.learning_starts, args.eval_every // 4),
            "gamma": c.gamma,
            "n_steps": c.n_step,
            # Ours copies every `target_update_period` gradient steps; SB3 counts env steps.
            "target_update_interval": round(c.target_update_period * c.batch_size / c.replay_ratio),
            "train_freq": 1,  # every vector step: num_envs env steps
            "gradient_steps": int(gradient_steps),
            "exploration_fraction": c.exploration_fraction,
            "exploration_final_eps": c.epsilon_end,
            "max_grad_norm": c.max_grad_norm,
            "policy_kwargs": {"net_arch": [c.hidden_size, c.hidden_size]},
        }
    return sb3.DQN("MlpPolicy", env, seed=seed, device="cpu", **settings)


def sb3_ppo(env: Any, seed: int, args: argparse.Namespace, zoo: bool) -> Any:
    import stable_baselines3 as sb3

    if zoo:  # rl-baselines3-zoo, hyperparams/ppo.yml, CartPole-v1
        settings: dict[str, Any] = {
            "n_steps": 32,
            "batch_size": 256,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "n_epochs": 20,
            "ent_coef": 0.0,
            "learning_rate": lambda progress: 1e-3 * progress,
            "clip_range": lambda progress: 0.2 * progress,
        }
    else:
        c = default_config("ppo")
        settings = {
            "n_steps": c.rollout_steps,
            "batch_size": c.batch_size,
            "n_epochs": c.update_epochs,
            "gamma": c.gamma,
            "gae_lambda": c.gae_lambda,
            "clip_range": c.clip_coef,
            "ent_coef": c.entropy_coefficient,
            "vf_coef": c.vf_coef * 0.5,  # ours weighs 0.5 x MSE, SB3 the MSE itself
            "max_grad_norm": c.max_grad_norm,
            "learning_rate": lambda progress: c.learning_rate * progress,
            "policy_kwargs": {"net_arch": {"pi": [c.hidden_size] * 2, "vf": [c.hidden_size] * 2}},
        }
    return sb3.PPO("MlpPolicy", env, seed=seed, device="cpu", **settings)


def run_sb3(algo: str, env_id: str, seed: int, args: argparse.Namespace, zoo: bool) -> Curve:
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    from adapters._rl import frame as _rl

    clock = Clock()  # from before the environments and the model, as ours
    n_envs = 1 if zoo and algo == "dqn" else default_config(algo).num_envs
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = (sb3_dqn if algo == "dqn" else sb3_ppo)(env, seed, args, zoo)
    curve = Curve("", env_id, seed)

    def policy(obs: torch.Tensor) -> torch.Tensor:
        actions, _ = model.predict(obs.cpu().numpy(), deterministic=True)
        return torch.as_tensor(actions)

    class Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.next_eval += args.eval_every
                started, started_cpu = time.perf_counter(), time.process_time()
                value = _rl.mean_eval_return(
                    env_id, policy, torch.device("cpu"), seed=seed + _rl.EVAL_SEED_OFFSET
                )
                clock.leave_out(started, started_cpu)
                curve.points.append((self.num_timesteps, *clock.training_seconds(), value))
            return True

    model.learn(total_timesteps=args.max_steps, callback=Evaluate())
    env.close()
    return curve


Runner = Callable[[str, int, argparse.Namespace], Curve]


def agents(algo: str, env_id: str, args: argparse.Namespace) -> list[tuple[str, str, Runner]]:
    """(row label, what it is compared with, runner) for one algorithm, in the order they run."""
    name = algo.upper()
    matched_overrides = {"per_alpha": 0.0} if algo == "dqn" else {}
    matched = f"ours {name}" + (", uniform n-step replay" if algo == "dqn" else "")
    rows: list[tuple[str, str, Runner]] = [
        (matched, "ours", lambda e, s, a: run_ours(algo, e, s, a, matched_overrides)),
    ]
    if not args.skip_sb3:
        rows.append(
            (f"SB3 {name}, same work", "sb3", lambda e, s, a: run_sb3(algo, e, s, a, False))
        )
    if algo == "dqn":
        rows.append(
            (
                "ours DQN defaults, prioritised replay",
                "",
                lambda e, s, a: run_ours(algo, e, s, a, {}),
            )
        )
    if args.zoo and not args.skip_sb3 and env_id == "CartPole-v1":  # the zoo's CartPole settings
        rows.append(
            (
                f"SB3 {name}, RL Zoo settings (more work)",
                "",
                lambda e, s, a: run_sb3(algo, e, s, a, True),
            )
        )
    return rows


def for_env(env_id: str, args: argparse.Namespace) -> argparse.Namespace:
    """The arguments with this environment's step budget and scoring interval."""
    if env_id == "Acrobot-v1":
        return argparse.Namespace(
            **{**vars(args), "max_steps": args.acrobot_steps, "eval_every": args.acrobot_eval_every}
        )
    return args


def run_gym(env_id: str, args: argparse.Namespace) -> list[Curve]:
    args = for_env(env_id, args)
    curves = []
    for seed in args.seeds:
        for algo in ("dqn", "ppo"):
            for label, _, runner in agents(algo, env_id, args):
                curve = runner(env_id, seed, args)
                curve.agent = label
                curves.append(curve)
                print(
                    f"{env_id} seed {seed} {label}: {curve.steps_per_second():,.0f} steps "
                    f"per CPU second, {curve.steps_per_second(cpu=False):,.0f} per wall second, "
                    f"final {curve.points[-1][-1]:.1f}",
                    flush=True,
                )
    return curves


def gym_table(env_id: str, curves: list[Curve], args: argparse.Namespace) -> list[str]:
    targets = TARGETS[env_id]
    lines = [
        "| agent | env steps per CPU s | env steps per wall s | "
        + " | ".join(f"steps to {t:g} | CPU s to {t:g}" for t in targets)
        + " | final eval return |",
        "|---|---:|---:|" + "---:|---:|" * len(targets) + "---:|",
    ]
    by_agent: dict[str, list[Curve]] = {}
    for curve in curves:
        by_agent.setdefault(curve.agent, []).append(curve)
    for agent, rows in by_agent.items():
        cells = [
            f"{statistics.median(r.steps_per_second() for r in rows):,.0f}",
            f"{statistics.median(r.steps_per_second(cpu=False) for r in rows):,.0f}",
        ]
        for target in targets:
            hits = [h for h in (r.first_reaching(target) for r in rows) if h is not None]
            share = f" ({len(hits)}/{len(rows)})"
            if not hits:
                cells += [f"not reached{share}", "-"]
                continue
            cells.append(f"{statistics.median(h[0] for h in hits):,.0f}{share}")
            cells.append(f"{statistics.median(h[1] for h in hits):.1f}")
        final = statistics.median(r.points[-1][-1] for r in rows)
        lines.append(f"| {agent} | " + " | ".join(cells) + f" | {final:.1f} |")
    return lines


def speed_ratios(
    env_id: str, curves: list[Curve], args: argparse.Namespace
) -> dict[str, dict[str, list]]:
    """Per algorithm, ours / SB3 env steps/s for each seed (run back to back), CPU and wall."""
    ratios: dict[str, dict[str, list]] = {}
    for algo in ("dqn", "ppo"):
        labels = {role: label for label, role, _ in agents(algo, env_id, args) if role}
        if "sb3" not in labels:
            continue
        for seed in args.seeds:
            runs = {
                role: next(c for c in curves if c.agent == label and c.seed == seed)
                for role, label in labels.items()
            }
            for clock in ("cpu", "wall"):
                speed = {role: run.steps_per_second(clock == "cpu") for role, run in runs.items()}
                by_clock = ratios.setdefault(algo.upper(), {"cpu": [], "wall": []})
                by_clock[clock].append(speed["ours"] / speed["sb3"])
    return ratios


def env_alone(task: Any, num_envs: int, vector_steps: int) -> float:
    """Env steps per CPU second of the trading environment alone, random actions."""
    import torch

    env = task.make_env(num_envs, torch.device("cpu"), max_position=3, hold_penalty_weight=0.5)
    generator = torch.Generator().manual_seed(0)
    env.reset()
    started = time.process_time()
    for _ in range(vector_steps):
        env.step(torch.randint(env.n_actions, (num_envs,), generator=generator))
    return vector_steps * num_envs / (time.process_time() - started)


def rollout_alone(task: Any, num_envs: int, vector_steps: int) -> float:
    """Env steps per CPU second of PPO's rollout alone: its actor acting, the env stepping."""
    import torch

    from adapters import ppo

    config = replace(default_config("ppo"), num_envs=num_envs)
    env = task.make_env(num_envs, torch.device("cpu"), max_position=3, hold_penalty_weight=0.5)
    net = ppo.actor_critic(env.obs_dim, env.n_actions, config.hidden_size, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    obs = env.reset()
    started = time.process_time()
    ppo.collect(net, env, obs, vector_steps, generator)
    return vector_steps * num_envs / (time.process_time() - started)


def trading_training(algo: str, task: Any, num_envs: int, steps: int) -> tuple[float, float]:
    """(training env steps per CPU second, held-out Sharpe) of one run of `steps` at the defaults."""
    import torch

    from adapters import dqn, ppo

    clock = Clock()
    timed = BenchTask(task, clock)
    module = dqn if algo == "dqn" else ppo
    config = replace(default_config(algo), num_envs=num_envs)
    run = module.learn(config, timed, epochs=1, steps_per_epoch=steps, device=torch.device("cpu"))
    return timed.env.steps / clock.training_seconds()[1], run.value


def run_trading(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    from adapters._rl import frame as _rl

    task = _rl.load_task({"env": "trading", "seed": 0})
    samples: dict[str, dict[int, list[float]]] = {}

    def note(what: str, n: int, value: float) -> None:
        samples.setdefault(what, {}).setdefault(n, []).append(value)

    for rep in range(args.reps):
        for n in args.trading_envs:
            note("env alone", n, env_alone(task, n, args.env_vector_steps))
            note("PPO rollout (acting and env)", n, rollout_alone(task, n, args.env_vector_steps))
            for algo in ("dqn", "ppo"):
                speed, sharpe = trading_training(algo, task, n, args.trading_steps)
                note(f"{algo.upper()} training", n, speed)
                note(f"{algo.upper()} held-out Sharpe", n, sharpe)
            print(
                f"trading rep {rep} n={n}: "
                + ", ".join(f"{what} {values[n][-1]:,.2f}" for what, values in samples.items()),
                flush=True,
            )
    return samples


def trading_table(samples: dict[str, dict[int, list[float]]], envs: list[int]) -> list[str]:
    lines = [
        "| | " + " | ".join(f"{n} envs" for n in envs) + f" | {envs[-1]} / {envs[0]} |",
        "|---|" + "---:|" * (len(envs) + 1),
    ]
    for what, by_n in samples.items():
        medians = [statistics.median(by_n[n]) for n in envs]
        sharpe = "Sharpe" in what
        cells = [f"{m:.2f}" if sharpe else f"{m:,.0f}" for m in medians]
        ratio = "" if sharpe else f"{medians[-1] / medians[0]:.1f}x"
        label = what if sharpe else f"{what}, env steps per CPU s"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


# What `--profile` times inside a training run: (owner, attribute, label, inside which part).
PROFILED = {
    "dqn": [
        (
            "Learner",
            "gradient_step",
            "gradient step (sample, 3 forward passes, backward, Adam)",
            "",
        ),
        ("Learner", "act", "acting (epsilon-greedy forward pass)", ""),
        ("NStepWindow", "push", "n-step window", ""),
        ("PrioritizedReplay", "add", "replay add", ""),
    ],
    "ppo": [
        ("module", "collect", "rollout (actor forward, sampling, env steps)", ""),
        ("module", "update", "update (advantages and minibatches)", ""),
        ("module", "advantages", "critic on the rollout and GAE", "update"),
        ("module", "loss_on", "minibatch loss (forward)", "update"),
    ],
}


def timed(owner: Any, attribute: str, totals: dict[str, list[float]], label: str) -> None:
    """Wrap `owner.attribute` so each call adds its CPU seconds and a count to `totals[label]`,
    except while an evaluation runs (`totals` holds the key "evaluating" then)."""
    original = getattr(owner, attribute)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "evaluating" in totals:
            return original(*args, **kwargs)
        started = time.process_time()
        if label == EVALUATION:
            totals["evaluating"] = [0.0, 0]
        try:
            return original(*args, **kwargs)
        finally:
            totals.pop("evaluating", None)
            seconds, calls = totals.setdefault(label, [0.0, 0])
            totals[label] = [seconds + time.process_time() - started, calls + 1]

    setattr(owner, attribute, wrapper)


EVALUATION = "evaluation (left out)"


def hidden_layer_products(config: Any, repeats: int = 2_000) -> float:
    """CPU microseconds of the matrix products of DQN's widest layer in one gradient step, timed
    apart: three forward passes (hidden x hidden weights on a batch) and their two backward
    products (the gradients of the weights and of the layer's input). No library avoids these."""
    import torch

    batch = torch.randn(config.batch_size, config.hidden_size)
    weight = torch.randn(config.hidden_size, config.hidden_size)
    grad = torch.randn(config.batch_size, config.hidden_size)
    started = time.process_time()
    for _ in range(repeats):
        for _ in range(3):
            batch @ weight.t()
        grad @ weight
        grad.t() @ batch
    return 1e6 * (time.process_time() - started) / repeats


def profile_parts(algo: str, args: argparse.Namespace) -> list[str]:
    """Where one CartPole-v1 training run at the same work spends its CPU time, part by part."""
    import importlib

    import torch

    from adapters._rl import frame as _rl
    from adapters.envs import GymVecEnv

    module = importlib.import_module(f"adapters.{algo}")
    totals: dict[str, list[float]] = {}
    parts = [*PROFILED[algo], ("", "", "environment steps", "rollout" if algo == "ppo" else "")]
    for owner, attribute, label, _ in PROFILED[algo]:
        timed(module if owner == "module" else getattr(module, owner), attribute, totals, label)
    timed(GymVecEnv, "step", totals, "environment steps")
    timed(_rl, "score_epoch", totals, EVALUATION)
    config = replace(default_config(algo), **({"per_alpha": 0.0} if algo == "dqn" else {}))
    task = _rl.load_task({"env": "CartPole-v1", "seed": 0})
    started = time.process_time()
    cpu = torch.device("cpu")
    run = module.learn(config, task, epochs=1, steps_per_epoch=args.max_steps, device=cpu)
    training = time.process_time() - started - totals[EVALUATION][0]
    lines = [
        f"### {algo.upper()}: {run.env_steps:,} env steps, {training:.2f} CPU s of training "
        f"({run.env_steps / training:,.0f} env steps per CPU s)",
        "",
        "| part | share of training CPU time | CPU us per call | calls | inside |",
        "|---|---:|---:|---:|---|",
    ]
    for _, _, label, inside in parts:
        seconds, calls = totals[label]
        share = f"{100 * seconds / training:.0f}%"
        lines.append(f"| {label} | {share} | {1e6 * seconds / calls:,.0f} | {calls:,} | {inside} |")
    if algo == "dqn":
        lines += [
            "",
            f"The {config.hidden_size}x{config.hidden_size} layer's matrix products alone (three "
            "forward passes and two backward products, timed apart): "
            f"{hidden_layer_products(config):,.0f} CPU us per gradient step.",
        ]
    return lines


def markdown(results: dict[str, Any], command: str, args: argparse.Namespace) -> str:
    lines = [
        "# RL benchmark: our DQN and PPO against stable-baselines3 at the same work",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {results['machine']}; torch {results['torch']}, one torch thread per agent; "
        f"stable-baselines3 {results['sb3'] or 'not run'}.",
    ]
    for env_id, curves in results["gym"].items():
        args = for_env(env_id, args)
        lines += [
            "",
            f"## {env_id}: {args.max_steps:,} env steps per run, seeds {args.seeds}",
            "",
            f"Scored every {args.eval_every:,} steps (10 greedy episodes, not timed). Steps and "
            "training CPU seconds to a return: medians over the seeds that reached it (how many "
            "did, in brackets); env steps/s and final return: medians over all seeds.",
            "",
            *gym_table(env_id, curves, args),
        ]
        ratios = speed_ratios(env_id, curves, args)
        if ratios:
            lines += ["", "Ours / SB3 at the same work, env steps/s, each seed back to back:", ""]
            for algo, by_clock in ratios.items():
                cpu, wall = by_clock["cpu"], by_clock["wall"]
                lines.append(
                    f"- {algo}: median {statistics.median(cpu):.2f}x per CPU second ("
                    + ", ".join(f"{x:.2f}" for x in cpu)
                    + f"), {statistics.median(wall):.2f}x per wall second ("
                    + ", ".join(f"{x:.2f}" for x in wall)
                    + ")"
                )
    if results["trading"]:
        lines += [
            "",
            f"## Trading (synthetic, mixed regimes, seed 0): medians of {args.reps} repetitions",
            "",
            f"Env alone and rollout: {args.env_vector_steps:,} vector steps. "
            f"Training: {args.trading_steps:,} "
            "env steps at the defaults but the number of environments (the same gradient steps "
            "per env step at every width), evaluation not timed.",
            "",
            *trading_table(results["trading"], args.trading_envs),
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=50_000)
    parser.add_argument("--eval-every", type=int, default=2_000)
    parser.add_argument("--acrobot-steps", type=int, default=100_000)
    parser.add_argument("--acrobot-eval-every", type=int, default=5_000)
    parser.add_argument("--only", choices=["cartpole", "acrobot", "trading"], nargs="+")
    parser.add_argument("--zoo", action="store_true", help="also SB3 with the RL Zoo's settings")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--trading-envs", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--trading-steps", type=int, default=65_536)
    parser.add_argument("--env-vector-steps", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: where ours spend CPU time on CartPole-v1 (--max-steps steps), to rl_profile.md",
    )
    return parser.parse_args(argv)


def command_line(argv: list[str] | None) -> str:
    return " ".join(["python benchmarks/bench_rl.py", *(sys.argv[1:] if argv is None else argv)])


def write_profile(args: argparse.Namespace, argv: list[str] | None) -> int:
    lines = [
        "# Where our RL agents spend their CPU time (CartPole-v1, the benchmark's same-work settings)",
        "",
        f"Command: `{command_line(argv)}`",
        "",
        "Each part's CPU time (this process, one torch thread) over the training, evaluation left "
        "out; a part inside another is counted in both.",
    ]
    for algo in ("dqn", "ppo"):
        lines += ["", *profile_parts(algo, args)]
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."]
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rl_profile.md").write_text(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    # Pay the optimiser's one-off import (about 2 s) before any clock starts.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    if args.profile:
        return write_profile(args, argv)
    sb3_version = None
    if not args.skip_sb3:
        import stable_baselines3

        sb3_version = stable_baselines3.__version__
    parts = args.only or ["cartpole", "acrobot", "trading"]
    gym = {env_id: run_gym(env_id, args) for part, env_id in PARTS.items() if part in parts}
    trading = run_trading(args) if "trading" in parts else {}
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end",
        "torch": torch.__version__,
        "sb3": sb3_version,
        "gym": gym,
        "trading": trading,
    }
    table = markdown(results, command_line(argv), args)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rl.md").write_text(table)
    raw = {**results, "args": vars(args), "command": command_line(argv)}
    raw["gym"] = {e: [asdict(c) for c in curves] for e, curves in gym.items()}
    (RESULTS / "rl.json").write_text(json.dumps(raw, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
