"""What fusing N DQN trials into one training loop buys, measured (docs/fused.md).

The network is the real one: `adapters.dqn.q_network` on CartPole-v1 (4 observations, 2
actions, `--hidden` wide, the default 128), its replay `adapters.dqn.PrioritizedReplay` and,
for "separate", its real `Learner.gradient_step`. For N = 1, 2, 4, 8, 16 members:

- learner: N members' gradient steps, one round = one step of each member.
  `separate`: N `Learner.gradient_step` calls one after another (today: one trial process per
  trial, here in one process, so without the processes' own overhead or their fight for a core);
  `fused bmm`: one `adapters._rl.fused.FusedDQN.gradient_step` (batched products, one backward,
  one functional Adam with a learning rate per member); `fused vmap`: the same from
  `torch.func.vmap(grad_and_value)` over the real single-member `adapters.dqn.q_values`.
  Batches all `--batch` (128), or mixed (drawn log-uniform from 64..4096 as the sampler does,
  one fixed draw): `masked` pads every member to the group's largest, `banded` runs one fused
  step per band of batch sizes within 2x. Each member samples its own replay with its own
  generator in every variant (a loop over members).
- loop: the whole DQN vector step on CartPole-v1 (act, environments, n-step window, replay
  add, one gradient step: the default batch 128 with replay ratio 16 and 8 environments makes
  one gradient step per vector step). `separate`: N members each with its own `GymVecEnv` of 8
  environments (Gymnasium's synchronous vector env, as a trial has today) and the real loop
  body. `fused`: one act over the stacked networks and ONE vector env of 8N CartPoles, with
  Gymnasium's numpy `CartPoleVectorEnv` standing in for a tensor CartPole (the repo has none:
  its autoreset is next-step, not the same-step `final_obs` our loop bootstraps from, which
  changes nothing of the cost); window, replay add and sampling still loop over members.
- equivalence: members with different learning rates, batch sizes (so padding), Huber deltas,
  soft-backup temperatures and target periods, trained alone by the real `Learner` and inside
  one fused group, 100 gradient steps; the largest relative difference of a member's loss.

Times are CPU seconds of this process (one torch thread, as a trial process runs), the median
of `--reps` repetitions: the machine is shared, and wall time would count other work too.

`--end-to-end`: the real thing, `adapters.dqn.adapter.train_fused` against `train`. 8 DQN
members drawn from the study's default search space on CartPole-v1 (the first draw free, the
other 7 with its hidden width and a batch size in its band, as a group is asked), trained for
`--epochs` of `--steps-per-epoch`: in groups of N = 1 (each member alone with `train`), 2, 4, 8,
one group after another. Wall and CPU seconds of all 8, and how many members' values are the
ones they get alone. `--profile` instead trains the 8 in one group with a timer around each
part of the loop (where the time goes), then alone. `--algo ppo` does both for PPO
(`adapters.ppo.adapter.train_fused`): the other 7 with the first's parameters that PPO's
`fuse_key` reads (hidden width, minibatch size, rollout length), as the pool asks a group.

    python benchmarks/bench_fused.py                  # CPU; writes benchmarks/results/fused.json
    python benchmarks/bench_fused.py --device cuda    # a GPU (wall time, synchronised)
    python benchmarks/bench_fused.py --end-to-end     # train_fused against train, N = 1, 2, 4, 8
    python benchmarks/bench_fused.py --end-to-end --profile --draw-seed 2
    python benchmarks/bench_fused.py --end-to-end --algo ppo --draw-seed 0
    python benchmarks/bench_fused.py --end-to-end --algo ppo --profile --draw-seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from adapters import dqn
from adapters._rl import fused
from adapters.envs import GymVecEnv
from adapters.envs.base import StepResult

RESULTS = Path(__file__).resolve().parent / "results"
OBS_DIM, N_ACTIONS = 4, 2  # CartPole-v1
REPLAY_ROWS = 8192


@dataclass
class Member:
    config: dqn.DQNConfig
    learner: dqn.Learner


def make_member(index: int, config: dqn.DQNConfig, device: torch.device) -> Member:
    """The real network, Adam and replay of one trial, the replay filled with CartPole-like
    transitions; the same index and config give the same member, bit for bit."""
    torch.manual_seed(1_000 + index)
    net = dqn.q_network(OBS_DIM, N_ACTIONS, config.hidden_size, device)
    replay = dqn.PrioritizedReplay(REPLAY_ROWS, OBS_DIM, config.per_alpha, device)
    data = torch.Generator().manual_seed(500 + index)
    obs, next_obs = (torch.randn(REPLAY_ROWS, OBS_DIM, generator=data) for _ in range(2))
    action = torch.randint(N_ACTIONS, (REPLAY_ROWS,), generator=data).float()
    ret = torch.rand(REPLAY_ROWS, generator=data) * 3
    alive = torch.rand(REPLAY_ROWS, generator=data) > 0.05
    discount = alive * config.gamma**config.n_step
    replay.add(*(t.to(device) for t in (obs, action, ret, next_obs, discount)))
    generator = torch.Generator(device=device).manual_seed(7 + index)
    optimizer = net.optimizer(config.learning_rate)
    return Member(config, dqn.Learner(net, net.frozen_copy(), optimizer, replay, generator))


def group_of(members: list[Member]) -> fused.FusedDQN:
    return fused.FusedDQN.of(
        [m.learner.q_net for m in members],
        [m.learner.target_net for m in members],
        [m.config for m in members],
    )


def sample_all(members: list[Member], beta: float) -> tuple[list[Any], list[tuple]]:
    """Each member's rows and batch from its own replay and generator, as it would alone."""
    rows, batches = [], []
    for m in members:
        picked, importance = m.learner.replay.sample(m.config.batch_size, beta, m.learner.generator)
        rows.append(picked)
        batches.append((*m.learner.replay.batch(picked), importance))
    return rows, batches


def fused_round(group: fused.FusedDQN, members: list[Member], beta: float = 0.4) -> Any:
    """One gradient step of every member in one fused step; their losses."""
    rows, batches = sample_all(members, beta)
    losses, td_error = group.gradient_step(fused.pad_batches(batches))
    for i, m in enumerate(members):
        if m.config.per_alpha > 0:
            m.learner.replay.update(rows[i], td_error[i, : len(rows[i])])
    return losses


def banded_round(groups: list[tuple[fused.FusedDQN, list[Member]]]) -> None:
    for group, members in groups:
        fused_round(group, members)


def separate_round(members: list[Member], beta: float = 0.4) -> None:
    for m in members:
        m.learner.gradient_step(m.config, beta)


def vmap_member_loss(shapes: dict) -> Callable[..., torch.Tensor]:
    """One member's double-DQN loss on its padded batch, written with the real `q_values`."""

    def loss(flat, target, obs, next_obs, action, ret, discount, importance, mask, delta):
        net, target_net = fused.views(flat, shapes), fused.views(target, shapes)
        next_q = dqn.q_values(target_net, next_obs)
        online_next_q = dqn.q_values(net, next_obs).detach()
        best = online_next_q.argmax(dim=1, keepdim=True)
        value = torch.addcmul(ret, discount, next_q.gather(1, best).squeeze(1)).detach()
        predicted = dqn.q_values(net, obs).gather(1, action.long().unsqueeze(1)).squeeze(1)
        size = (predicted - value).abs()
        rows = torch.where(size < delta, 0.5 * size * size, delta * (size - 0.5 * delta))
        return (importance * rows * mask).sum() / mask.sum()

    return loss


def vmap_round(group: fused.FusedDQN, members: list[Member], loss: Callable) -> None:
    _, batches = sample_all(members, 0.4)
    b = fused.pad_batches(batches)
    data = (b.obs, b.next_obs, b.action, b.ret, b.discount, b.importance, b.mask)
    grads, _ = fused.vmap_grad(loss, group.online, group.target, *data, group.hyper.huber_delta)
    fused.clip_per_member(grads, group.hyper.max_grad_norm)
    group.adam.step(grads, group.learning_rate)


def configs(n: int, batch_sizes: list[int], hidden: int) -> list[dqn.DQNConfig]:
    lrs = [1e-3 * 2 ** ((i % 5) - 2) for i in range(n)]
    return [
        dqn.DQNConfig(learning_rate=lr, batch_size=b, hidden_size=hidden, per_alpha=0.0)
        for lr, b in zip(lrs, batch_sizes, strict=True)
    ]


def mixed_batches(n: int) -> list[int]:
    """One fixed log-uniform draw from the study's batch range, as the sampler would draw."""
    draw = random.Random(0)
    return [round(math.exp(draw.uniform(math.log(64), math.log(4096)))) for _ in range(n)]


def clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":

        def wall() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return wall
    return time.process_time


def per_second(
    work: Callable[[], None], count: int, rounds: int, reps: int, now: Callable
) -> float:
    """`count` units of work per round: the median over `reps` of units per second."""
    work()  # warm: first calls allocate
    rates = []
    for _ in range(reps):
        start = now()
        for _ in range(rounds):
            work()
        rates.append(count * rounds / max(now() - start, 1e-9))
    return statistics.median(rates)


def learner_variants(batches: list[int], hidden: int, device: torch.device) -> dict[str, Any]:
    """What one round of each variant runs, on fresh members (the same members for each)."""
    cfgs = configs(len(batches), batches, hidden)

    def fresh() -> list[Member]:
        return [make_member(i, c, device) for i, c in enumerate(cfgs)]

    separate, masked = fresh(), fresh()
    group = group_of(masked)
    equal = len(set(batches)) == 1
    variants: dict[str, Callable[[], None]] = {
        "separate": lambda: separate_round(separate),
        "fused bmm" if equal else "fused bmm, masked": lambda: fused_round(group, masked),
    }
    if equal:
        vmapped = fresh()
        vgroup, loss = group_of(vmapped), vmap_member_loss(dict(vmapped[0].learner.q_net.shapes))
        variants["fused vmap"] = lambda: vmap_round(vgroup, vmapped, loss)
        return variants
    banded = fresh()
    bands = [
        (group_of([banded[i] for i in band]), [banded[i] for i in band])
        for band in fused.batch_bands(batches)
    ]
    variants[f"fused bmm, {len(bands)} bands"] = lambda: banded_round(bands)
    return variants


def learner_rows(n: int, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Member gradient steps per second, separate and fused, equal and mixed batches."""
    rows = []
    for label, batches in (("equal", [args.batch] * n), ("mixed", mixed_batches(n))):
        padded = n * max(batches) / sum(batches)
        for name, work in learner_variants(batches, args.hidden, device).items():
            rate = per_second(work, n, args.rounds, args.reps, clock(device))
            rows.append(
                {
                    "part": "learner",
                    "members": n,
                    "batches": label,
                    "variant": name,
                    "batch_sizes": batches,
                    "padding": round(padded, 2),
                    "gradient_steps_per_s": rate,
                }
            )
    return rows


class NumpyCartPoles:
    """Gymnasium's numpy-vectorised CartPole behind our step interface (cost only: its
    autoreset is next-step, so `final_obs` is just `obs` here)."""

    def __init__(self, num_envs: int, device: torch.device, seed: int = 0) -> None:
        import gymnasium as gym

        self.env = gym.make_vec(
            "CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point"
        )
        self.device, self.seed = device, seed

    def _tensor(self, array: Any) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def reset(self) -> torch.Tensor:
        return self._tensor(self.env.reset(seed=self.seed)[0])

    def step(self, actions: torch.Tensor) -> StepResult:
        obs, reward, terminated, truncated, _ = self.env.step(actions.cpu().numpy())
        obs_t = self._tensor(obs)
        return StepResult(
            obs_t,
            self._tensor(reward.astype("float32")),
            self._tensor(terminated),
            self._tensor(truncated),
            obs_t,
        )


def separate_loop(members: list[Member], device: torch.device) -> Callable[[], None]:
    """Today's loop body, member after member, each with its own 8 environments."""
    envs = [
        GymVecEnv("CartPole-v1", num_envs=8, device=device, seed=i) for i in range(len(members))
    ]
    windows = [dqn.NStepWindow(m.config.n_step, m.config.gamma) for m in members]
    obs = [env.reset() for env in envs]

    def body() -> None:
        for i, m in enumerate(members):
            action = m.learner.act(obs[i], 0.1, N_ACTIONS)
            step = envs[i].step(action)
            transition = windows[i].push(obs[i], action, step)
            if transition is not None:
                m.learner.replay.add(*transition)
            obs[i] = step.obs
            m.learner.gradient_step(m.config, 0.4)

    return body


def fused_loop(members: list[Member], device: torch.device) -> Callable[[], None]:
    """One act over the stacked networks, one vector env of 8N, one fused gradient step."""
    n, group = len(members), group_of(members)
    env = NumpyCartPoles(8 * n, device)
    windows = [dqn.NStepWindow(m.config.n_step, m.config.gamma) for m in members]
    epsilon = torch.full((n, 1), 0.1, device=device)
    state = {"obs": env.reset()}
    generator = torch.Generator(device=device).manual_seed(0)

    def body() -> None:
        obs = state["obs"].view(n, 8, OBS_DIM)
        with torch.no_grad():
            greedy = fused.dueling_q_values(fused.views(group.online, group.shapes), obs).argmax(2)
            explore = torch.rand((n, 8), generator=generator, device=device) < epsilon
            random_action = torch.randint(N_ACTIONS, (n, 8), generator=generator, device=device)
            action = torch.where(explore, random_action, greedy)
        step = env.step(action.flatten())
        for i, m in enumerate(members):
            own = StepResult(*(t.view(n, 8, *t.shape[1:])[i] for t in step))
            transition = windows[i].push(obs[i], action[i], own)
            if transition is not None:
                m.learner.replay.add(*transition)
        state["obs"] = step.obs
        fused_round(group, members)

    return body


def loop_rows(n: int, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Environment steps per second of the whole DQN vector step, separate and fused."""
    rows, cfgs = [], configs(n, [args.batch] * n, args.hidden)
    for name, make in (("separate", separate_loop), ("fused", fused_loop)):
        body = make([make_member(i, c, device) for i, c in enumerate(cfgs)], device)
        rate = per_second(body, 8 * n, max(1, args.rounds // 2), args.reps, clock(device))
        rows.append({"part": "loop", "members": n, "variant": name, "env_steps_per_s": rate})
    return rows


EQUIVALENCE_PARAMS = [  # learning rate, batch size, Huber delta, soft-backup temperature, target period
    (1e-3, 64, 10.0, 0.0, 30),
    (3e-4, 128, 1.0, 0.05, 50),
    (1e-2, 96, 5.0, 0.0, 250),
    (2e-3, 200, 10.0, 0.02, 40),
    (5e-4, 128, 2.0, 0.0, 100),
    (1e-3, 80, 10.0, 0.01, 60),
    (4e-3, 160, 20.0, 0.0, 25),
    (7e-4, 72, 3.0, 0.0, 70),
]


def equivalence_configs(n: int, hidden: int, per_alpha: float = 0.0) -> list[dqn.DQNConfig]:
    return [
        dqn.DQNConfig(
            learning_rate=lr,
            batch_size=b,
            huber_delta=d,
            entropy_coefficient=e,
            target_update_period=t,
            per_alpha=per_alpha,
            hidden_size=hidden,
        )
        for lr, b, d, e, t in EQUIVALENCE_PARAMS[:n]
    ]


@contextlib.contextmanager
def backpropagated() -> Iterator[list[float]]:
    """The losses back-propagated meanwhile (a trial's one per gradient step), in order."""
    losses: list[float] = []
    backward = torch.Tensor.backward

    def recording(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        losses.append(float(self.detach()))
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = recording  # type: ignore[method-assign]
    try:
        yield losses
    finally:
        torch.Tensor.backward = backward  # type: ignore[method-assign]


def losses_alone(member: Member, steps: int, *, refresh: bool = True) -> list[float]:
    """The losses the real `Learner.gradient_step` back-propagates, one per step."""
    with backpropagated() as losses:
        for step in range(1, steps + 1):
            member.learner.gradient_step(member.config, 0.4)
            if refresh and step % member.config.target_update_period == 0:
                member.learner.target_net.flat.copy_(member.learner.q_net.flat)
    return losses


def losses_fused(members: list[Member], steps: int) -> list[list[float]]:
    """Each member's losses inside one fused group, step for step."""
    group, losses = group_of(members), [[] for _ in members]
    periods = torch.tensor([m.config.target_update_period for m in members])
    for step in range(1, steps + 1):
        for i, loss in enumerate(fused_round(group, members).tolist()):
            losses[i].append(loss)
        group.refresh_targets(step % periods == 0)
    return losses


def worst_difference(cfgs: list[dqn.DQNConfig], steps: int, device: torch.device) -> list[float]:
    """Per member: the largest relative difference of a loss, alone against in the group."""
    alone = [losses_alone(make_member(i, c, device), steps) for i, c in enumerate(cfgs)]
    grouped = losses_fused([make_member(i, c, device) for i, c in enumerate(cfgs)], steps)
    return [
        max(abs(a - g) / max(abs(a), 1e-12) for a, g in zip(one, other, strict=True))
        for one, other in zip(alone, grouped, strict=True)
    ]


def tables(rows: list[dict], equivalence: dict[str, list[float]]) -> str:
    lines = [
        "| members | batches | variant | member gradient steps/s | x separate |",
        "|---:|---|---|---:|---:|",
    ]
    base = {
        (r["members"], r["batches"]): r["gradient_steps_per_s"]
        for r in rows
        if r["part"] == "learner" and r["variant"] == "separate"
    }
    for r in (r for r in rows if r["part"] == "learner"):
        ratio = r["gradient_steps_per_s"] / base[(r["members"], r["batches"])]
        batches = r["batches"] + ("" if r["batches"] == "equal" else f" (padding x{r['padding']})")
        lines.append(
            f"| {r['members']} | {batches} | {r['variant']} | "
            f"{r['gradient_steps_per_s']:,.0f} | {ratio:.2f} |"
        )
    lines += [
        "",
        "| members | separate env steps/s | fused env steps/s | x separate |",
        "|---:|---:|---:|---:|",
    ]
    loops = {
        (r["members"], r["variant"]): r["env_steps_per_s"] for r in rows if r["part"] == "loop"
    }
    for n in sorted({n for n, _ in loops}):
        one, both = loops[(n, "separate")], loops[(n, "fused")]
        lines.append(f"| {n} | {one:,.0f} | {both:,.0f} | {both / one:.2f} |")
    lines += [
        "",
        "| 8 members, alone against fused | largest relative difference, per member |",
        "|---|---|",
    ]
    for replay, worst in equivalence.items():
        lines.append(f"| {replay} | {', '.join(f'{w:.1e}' for w in worst)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (a GPU: wall time)")
    parser.add_argument("--members", default="1,2,4,8,16", help="group sizes, comma-separated")
    parser.add_argument("--hidden", type=int, default=128, help="hidden width (DQN's default)")
    parser.add_argument(
        "--batch", type=int, default=128, help="the equal batch size (DQN's default)"
    )
    parser.add_argument("--rounds", type=int, default=40, help="rounds timed per repetition")
    parser.add_argument("--reps", type=int, default=3, help="repetitions; the median is kept")
    parser.add_argument("--skip-loop", action="store_true", help="learner and equivalence only")
    parser.add_argument("--out", default=None, help="the JSON file (default: results/)")
    parser.add_argument(
        "--end-to-end", action="store_true", help="train_fused against train (DQN, CartPole-v1)"
    )
    parser.add_argument("--draw-seed", type=int, default=0, help="end-to-end: the draws' seed")
    parser.add_argument("--epochs", type=int, default=2, help="end-to-end: epochs")
    parser.add_argument(
        "--steps-per-epoch", type=int, default=4000, help="end-to-end: environment steps an epoch"
    )
    parser.add_argument("--groups", default="1,2,4,8", help="end-to-end: group sizes")
    parser.add_argument(
        "--fixed-batch",
        action="store_true",
        help="end-to-end: every member with the first's batch size, as the pool asks a group",
    )
    parser.add_argument(
        "--profile", action="store_true", help="end-to-end: where one group of 8's time goes"
    )
    parser.add_argument(
        "--algo", choices=("dqn", "ppo"), default="dqn", help="end-to-end: which adapter"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if args.end_to_end and args.algo == "ppo":
        (profile_ppo_group if args.profile else end_to_end_ppo)(args, device)
        return
    if args.end_to_end and args.profile:
        profile_group(args, device)
        return
    if args.end_to_end:
        end_to_end(args, device)
        return
    args.out = args.out or str(RESULTS / "fused.json")
    rows: list[dict] = []
    for n in (int(x) for x in args.members.split(",")):
        rows += learner_rows(n, args, device)
        if not args.skip_loop:
            rows += loop_rows(n, args, device)
        print(f"measured {n} members", file=sys.stderr, flush=True)
    equivalence: dict[str, list[float]] = {}
    for replay, per_alpha in (("uniform", 0.0), ("prioritised (per_alpha 0.6)", 0.6)):
        cfgs = equivalence_configs(8, args.hidden, per_alpha)
        equivalence[f"{replay}, 100 steps run apart"] = worst_difference(cfgs, 100, device)
        lockstep = lockstep_differences(cfgs, 100, device)
        equivalence[f"{replay}, each step from the same state: loss"] = [w[0] for w in lockstep]
        equivalence[f"{replay}, each step from the same state: gradient"] = [w[1] for w in lockstep]
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    machine = (
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.device}"
    )
    table = tables(rows, equivalence)
    print(f"Machine: {machine}; one torch thread. Load at the end: `{load}`\n\n{table}")
    result = {
        "command": " ".join(sys.argv),
        "machine": machine,
        "uptime": load,
        "rows": rows,
        "equivalence": equivalence,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def lockstep_differences(
    cfgs: list[dqn.DQNConfig], steps: int, device: torch.device
) -> list[tuple[float, float]]:
    """Per member, over `steps` steps: the largest relative difference of the loss, and of the
    clipped gradient (its largest element difference over its norm), between the real
    `Learner.gradient_step` and one fused step taken from the same state on the same rows.

    Before every step the group is set to the members' own state (weights, target, Adam's
    moments and count) and draws with a copy of each member's generator from its replay, so
    each step compares the maths of one step, not trajectories that rounding has parted."""
    members = [make_member(i, c, device) for i, c in enumerate(cfgs)]
    group = group_of(members)
    worst = [(0.0, 0.0) for _ in members]
    for step in range(1, steps + 1):
        batches = []
        for i, m in enumerate(members):
            learner = m.learner
            with torch.no_grad():
                group.online[i] = learner.q_net.flat
                group.target[i] = learner.target_net.flat
            if learner.optimizer.state:
                group.adam.load_member(i, learner.optimizer.state[learner.q_net.flat])
            draws = torch.Generator(device=device)
            draws.set_state(learner.generator.get_state())
            rows, importance = learner.replay.sample(m.config.batch_size, 0.4, draws)
            batches.append((*learner.replay.batch(rows), importance))
        fused_losses, _ = group.gradient_step(fused.pad_batches(batches))
        alone = [losses_alone_step(m) for m in members]
        for i, (loss, grad) in enumerate(alone):
            loss_diff = abs(loss - float(fused_losses[i])) / abs(loss)
            grad_diff = float((group.online.grad[i] - grad).abs().max() / grad.norm())
            worst[i] = (max(worst[i][0], loss_diff), max(worst[i][1], grad_diff))
        for m in members:
            if step % m.config.target_update_period == 0:
                m.learner.target_net.flat.copy_(m.learner.q_net.flat)
    return worst


def losses_alone_step(member: Member) -> tuple[float, torch.Tensor]:
    """One real gradient step: its loss and the clipped gradient it stepped with."""
    loss = losses_alone(member, 1, refresh=False)[0]
    return loss, member.learner.q_net.grad.clone()


def drawn_members(count: int, seed: int, *, fixed_batch: bool = False) -> list[dict[str, Any]]:
    """`count` DQN trials' parameters from the study's default search space on CartPole-v1:
    the first drawn freely, the others with its hidden width and a batch size drawn
    log-uniformly inside its band (`fused_dqn.batch_band`), or with its very batch size
    (`fixed_batch`: what the pool's group path asks, fixing what `fuse_key` reads)."""
    import optuna

    from adapters._rl import fused_dqn

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = {**dqn.adapter.options, "env": "CartPole-v1"}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    draws = [dqn.adapter.suggest(study.ask(), options) for _ in range(count)]
    first = draws[0]
    band = fused_dqn.batch_band(first["batch_size"])
    low = dqn.BATCH_SIZE_MIN * 2**band
    high = dqn.BATCH_SIZE_MAX if band == fused_dqn.BANDS - 1 else 2 * low - 1
    draw = random.Random(seed)
    for params in draws[1:]:
        params["hidden_size"] = first["hidden_size"]
        params["batch_size"] = round(math.exp(draw.uniform(math.log(low), math.log(high))))
        if fixed_batch:
            params["batch_size"] = first["batch_size"]
    return draws


def end_to_end(args: argparse.Namespace, device: torch.device) -> None:
    """8 members trained in groups of N, one group after another; a table per N."""
    from adapters.base import Member

    params = drawn_members(8, args.draw_seed, fixed_batch=args.fixed_batch)
    options = {**dqn.adapter.options, "env": "CartPole-v1", "steps_per_epoch": args.steps_per_epoch}
    print(
        f"8 members: hidden {params[0]['hidden_size']}, batch sizes "
        f"{[p['batch_size'] for p in params]}, per_alpha "
        f"{[round(p['per_alpha'], 2) for p in params]}",
        file=sys.stderr,
    )
    rows: list[dict[str, Any]] = []
    values: dict[int, list[float]] = {}
    for n in (int(x) for x in args.groups.split(",")):
        wall, cpu, got = time.perf_counter(), time.process_time(), []
        for start in range(0, len(params), n):
            members = [
                Member(p, lambda epoch, value: None, None) for p in params[start : start + n]
            ]
            entries = dqn.adapter.train_fused(
                members, epochs=args.epochs, device=device, options=options
            )
            for entry in entries:
                if isinstance(entry, BaseException):
                    raise entry
            got += entries
        values[n] = got
        rows.append(
            {
                "members_per_group": n,
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu,
                "values": got,
            }
        )
        print(f"groups of {n}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    machine = f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    base = rows[0]
    lines = [
        f"Machine: {machine}, {args.device}; one torch thread. Load at the end: `{load}`",
        f"8 DQN members on CartPole-v1, {args.epochs} epochs of {args.steps_per_epoch} steps, "
        f"drawn with seed {args.draw_seed}{', one batch size' if args.fixed_batch else ''}: hidden {params[0]['hidden_size']}, batch sizes "
        f"{', '.join(str(p['batch_size']) for p in params)}",
        "",
        "| members per group | wall s | CPU s | x groups of 1 (CPU) | values as alone |",
        "|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        own = values[base["members_per_group"]]
        same = sum(a == b for a, b in zip(r["values"], own, strict=True))
        lines.append(
            f"| {r['members_per_group']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{base['cpu_s'] / r['cpu_s']:.2f} | {same} of {len(own)} |"
        )
    print("\n".join(lines))
    result = {"command": " ".join(sys.argv), "machine": machine, "uptime": load, "rows": rows}
    result["params"] = params
    fixed = "_fixed_batch" if args.fixed_batch else ""
    name = f"fused_end_to_end_{args.device}_draw{args.draw_seed}{fixed}.json"
    out = Path(args.out or RESULTS / name)
    out.write_text(json.dumps(result, indent=1) + "\n")


PROFILED = [  # (label, owner, attribute): the parts of a group's run, timed where they are called
    ("gradient step", "fused_group.GroupRun", "_gradient_step"),
    ("- forward (3 passes and the loss)", "fused", "dqn_losses"),
    ("- backward", "torch.Tensor", "backward"),
    ("- sampling the members' replays", "dqn.PrioritizedReplay", "sample"),
    ("- prioritised replay's priority updates", "dqn.PrioritizedReplay", "update"),
    ("- Adam, per member", "fused.FusedAdam", "step_rows"),
    ("environments", "fused_envs.GymGroupEnv", "step"),
    ("evaluation", "fused_envs", "scores"),
    ("n-step window", "fused_envs.GroupWindow", "push"),
    ("replay adds", "fused_envs", "put"),
]


def profile_group(args: argparse.Namespace, device: torch.device) -> None:
    """One group of the 8 drawn members, with a timer (CPU seconds) around each part, and the
    same 8 trained alone with `train`, one after another."""
    from adapters._rl import fused_envs, fused_group
    from adapters.base import Member

    params = drawn_members(8, args.draw_seed, fixed_batch=args.fixed_batch)
    options = {**dqn.adapter.options, "env": "CartPole-v1", "steps_per_epoch": args.steps_per_epoch}
    owners = {"fused_group": fused_group, "fused_envs": fused_envs, "fused": fused, "dqn": dqn}
    owners["torch"] = torch
    spent: dict[str, float] = dict.fromkeys([label for label, _, _ in PROFILED], 0.0)
    steps = {"fused": 0, "member": 0}
    originals = []
    for label, owner_name, attribute in PROFILED:
        first, *rest = owner_name.split(".")
        owner = owners[first]
        for part in rest:
            owner = getattr(owner, part)
        real = getattr(owner, attribute)
        originals.append((owner, attribute, real))

        def timed(*a: Any, _real: Any = real, _label: str = label, **k: Any) -> Any:
            started = time.process_time()
            try:
                return _real(*a, **k)
            finally:
                spent[_label] += time.process_time() - started
                if _label == "gradient step":
                    steps["fused"] += 1
                    steps["member"] += len(a[3])  # the members that owed the step

        setattr(owner, attribute, timed)
    members = [Member(p, lambda epoch, value: None, None) for p in params]
    started = time.process_time()
    try:
        dqn.adapter.train_fused(members, epochs=args.epochs, device=device, options=options)
    finally:
        for owner, attribute, real in originals:
            setattr(owner, attribute, real)
    group = time.process_time() - started
    started = time.process_time()
    for p in params:
        dqn.adapter.train(
            p, epochs=args.epochs, device=device, options=options, report=lambda e, v: None
        )
    alone = time.process_time() - started
    batches = [p["batch_size"] for p in params]
    print(
        f"8 members drawn with seed {args.draw_seed}: hidden {params[0]['hidden_size']}, "
        f"batch {min(batches)}..{max(batches)}, {sum(p['per_alpha'] > 0 for p in params)} "
        f"prioritised; {steps['fused']:,} fused steps for {steps['member']:,} member steps\n"
    )
    print("| part | CPU s |\n|---|---:|")
    print(f"| the 8 alone (`train`, one after another) | {alone:.2f} |")
    print(f"| the group (timers included) | {group:.2f} |")
    for label, _, _ in PROFILED:
        print(f"| {label} | {spent[label]:.2f} |")


def drawn_ppo_members(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` PPO trials' parameters from the study's default search space on CartPole-v1:
    the first drawn freely, the others with the first's values of what `fuse_key` reads (as
    the pool's group path asks them: `orchestrator.run.trial.group.shape_of`)."""
    import optuna

    from adapters import ppo
    from orchestrator.run.trial.member import shape_of

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = {**ppo.adapter.options, "env": "CartPole-v1"}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    draws = [ppo.adapter.suggest(study.ask(), options) for _ in range(count)]
    shape = shape_of(ppo.adapter, draws[0])
    return [{**params, **shape} for params in draws]


def _ppo_setting(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    from adapters import ppo

    # A process's first `torch.optim.Adam` imports torch._dynamo (about 1.2 s of CPU): a cost
    # of the process, paid by `train` and not by a group (which builds no torch.optim). Paid
    # here before any timing, so that the tables compare the training only.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])

    params = drawn_ppo_members(8, args.draw_seed)
    options = {**ppo.adapter.options, "env": "CartPole-v1", "steps_per_epoch": args.steps_per_epoch}
    first = params[0]
    what = (
        f"hidden {first['hidden_size']}, batch {first['batch_size']}, rollout "
        f"{first['rollout_steps']} steps, update_epochs {[p['update_epochs'] for p in params]}"
    )
    return params, options, what


def end_to_end_ppo(args: argparse.Namespace, device: torch.device) -> None:
    """8 PPO members trained in groups of N (N = 1: `train`), one group after another."""
    from adapters import ppo
    from adapters.base import Member

    params, options, what = _ppo_setting(args)
    print(f"8 PPO members: {what}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for n in (int(x) for x in args.groups.split(",")):
        wall, cpu, got = time.perf_counter(), time.process_time(), []
        for start in range(0, len(params), n):
            members = [
                Member(p, lambda epoch, value: None, None) for p in params[start : start + n]
            ]
            entries = ppo.adapter.train_fused(
                members, epochs=args.epochs, device=device, options=options
            )
            for entry in entries:
                if isinstance(entry, BaseException):
                    raise entry
            got += entries
        rows.append(
            {
                "members_per_group": n,
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu,
                "values": got,
            }
        )
        print(f"groups of {n}: {rows[-1]['cpu_s']:.1f} CPU s", file=sys.stderr, flush=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    machine = f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    lines = [
        f"Machine: {machine}, {args.device}; one torch thread. Load at the end: `{load}`",
        f"8 PPO members on CartPole-v1, {args.epochs} epochs of {args.steps_per_epoch} steps, "
        f"drawn with seed {args.draw_seed}: {what}",
        "",
        "| members per group | wall s | CPU s | x groups of 1 (CPU) | values as alone |",
        "|---:|---:|---:|---:|---|",
    ]
    own = rows[0]["values"]
    for r in rows:
        same = sum(a == b for a, b in zip(r["values"], own, strict=True))
        lines.append(
            f"| {r['members_per_group']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{rows[0]['cpu_s'] / r['cpu_s']:.2f} | {same} of {len(own)} |"
        )
    print("\n".join(lines))
    result = {"command": " ".join(sys.argv), "machine": machine, "uptime": load, "rows": rows}
    result["params"] = params
    name = f"fused_ppo_end_to_end_{args.device}_draw{args.draw_seed}.json"
    Path(args.out or RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")


PPO_PROFILED = [  # (label, owner, attribute), as PROFILED
    ("rollout (act and environments)", "fused_ppo_group.GroupRun", "_collect"),
    ("- environments", "fused_envs.GymGroupEnv", "step"),
    ("- act (one batched forward)", "fused_ppo_maths", "tower"),
    ("update", "fused_ppo_group.GroupRun", "_update"),
    ("- advantages (critic and GAE)", "fused_ppo_maths", "advantages"),
    ("- gradient steps", "fused_ppo_group.GroupRun", "_gradient_step"),
    ("  - forward and loss", "fused_ppo_maths", "losses"),
    ("  - backward", "torch.Tensor", "backward"),
    ("  - Adam, per member", "fused.FusedAdam", "step_rows"),
    ("evaluation", "fused_ppo_group.GroupRun", "_values"),
]


def profile_ppo_group(args: argparse.Namespace, device: torch.device) -> None:
    """One group of the 8 drawn PPO members with a timer (CPU seconds) around each part, then
    the same 8 alone with `train`, one after another."""
    from adapters import ppo
    from adapters._rl import fused_envs, fused_ppo_group, fused_ppo_maths
    from adapters.base import Member

    params, options, what = _ppo_setting(args)
    owners = {"fused_ppo_group": fused_ppo_group, "fused_envs": fused_envs, "fused": fused}
    owners |= {"fused_ppo_maths": fused_ppo_maths, "torch": torch}
    profiled = PPO_PROFILED
    spent: dict[str, float] = dict.fromkeys([label for label, _, _ in profiled], 0.0)
    originals = []
    inside_collect = {"on": False}
    for label, owner_name, attribute in profiled:
        first, *rest = owner_name.split(".")
        owner = owners[first]
        for part in rest:
            owner = getattr(owner, part)
        real = getattr(owner, attribute)
        originals.append((owner, attribute, real))

        def timed(*a: Any, _real: Any = real, _label: str = label, **k: Any) -> Any:
            if _label.startswith("- act") and not inside_collect["on"]:
                return _real(*a, **k)  # the tower outside the rollout is counted elsewhere
            if _label.startswith("rollout"):
                inside_collect["on"] = True
            started = time.process_time()
            try:
                return _real(*a, **k)
            finally:
                spent[_label] += time.process_time() - started
                if _label.startswith("rollout"):
                    inside_collect["on"] = False

        setattr(owner, attribute, timed)
    members = [Member(p, lambda epoch, value: None, None) for p in params]
    started = time.process_time()
    try:
        ppo.adapter.train_fused(members, epochs=args.epochs, device=device, options=options)
    finally:
        for owner, attribute, real in originals:
            setattr(owner, attribute, real)
    group = time.process_time() - started
    started = time.process_time()
    for p in params:
        ppo.adapter.train(
            p, epochs=args.epochs, device=device, options=options, report=lambda e, v: None
        )
    alone = time.process_time() - started
    print(f"8 PPO members drawn with seed {args.draw_seed}: {what}\n")
    print("| part | CPU s |\n|---|---:|")
    print(f"| the 8 alone (`train`, one after another) | {alone:.2f} |")
    print(f"| the group (timers included) | {group:.2f} |")
    for label, _, _ in profiled:
        print(f"| {label} | {spent[label]:.2f} |")


if __name__ == "__main__":
    main()
