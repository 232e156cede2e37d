"""How many trials an hour one GPU gets through, and how many OOMs and lost trials it costs.

A simulated 24 GB GPU is fed a stream of trials whose batch sizes are drawn over the search
space's whole range (64..4096, log scale) and whose true memory differs from the memory model's
estimate by a random factor (log-normal, `--spread`). Every strategy sees the same trials in the
same order. A trial takes its memory 5 s after it starts (model and first batch); one that does
not fit runs out of memory then, and the time until then is lost.

- sequential: one trial at a time (the pool with --concurrency 1);
- fixed: as many at once as the node has CPU cores (one trial per core, a common starting point), no protection:
  a trial that runs out of memory is lost;
- equal slots: the pool as it was before admission by bytes (`benchmarks/_equal_slots.py`): N
  slots sized at the smallest batch, ramp-up, halving, watchdog, OOM'd trials re-run twice;
- bytes, fixed: this project's pool, `orchestrator.run.pool.loop.Pool` itself on a simulated backend and
  a virtual clock (`orchestrator.run.simulated`), admitting trials by their estimate, with
  the estimate never refined;
- bytes, learning: the same, refining the estimate from each finished trial (`footprint`) as
  `run` does;
- oracle: knows every trial's true memory and starts a trial whenever it fits, up to the swarm;
  it never runs out of memory, and fills the GPU to the last MB, which a real allocator cannot;
  "oracle 80%" knows the same but keeps the planner's 20% for the allocator.

    python benchmarks/bench_pool.py                # 200 trials, spreads 0.1 0.25 0.5, 10 seeds
    python benchmarks/bench_pool.py --seeds 3      # quicker

With `--placement` it measures placement instead: the time to finish a study on 2 and on 8 GPUs
of mixed sizes, spread first (`orchestrator.run.pool.placement`, as `run` does) against first fit,
with trials on one GPU sharing its compute (`busy_fraction` of `orchestrator.run.simulated`:
what part of the GPU a trial alone keeps busy), for studies smaller and larger than the GPUs hold.

    python benchmarks/bench_pool.py --placement --seeds 5
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from _equal_slots import SlotPolicy, after_trial, before_spawn

from adapters.base import MemoryModel
from orchestrator.gpu.base import Device
from orchestrator.planning.hardware_budget import HardwareBudget
from orchestrator.planning.planner import GpuPlan, plan_node
from orchestrator.run.pool.loop import Pool
from orchestrator.run.pool.placement import Policy
from orchestrator.run.simulated import SimTrial, SimulatedStudy, SimulatedTrials

GPU_MB = 24576
ALLOCATE_AFTER_S = 5.0  # a trial takes its memory early: model and first batch
MAX_RETRIES = 2
BATCHES = (64, 4096)  # the search space's range, which every adapter declares
WARM_UP = 10  # OOMs of the first trials are the price of learning; later ones are counted apart
STRATEGIES = (
    "sequential",
    "fixed",
    "equal slots",
    "bytes, fixed",
    "bytes, learning",
    "oracle80",
    "oracle",
)


@dataclass(frozen=True)
class Trial:
    batch_size: int
    estimate_mb: float
    true_mb: float
    seconds: float


def make_trials(n: int, model: MemoryModel, spread: float, rng: random.Random) -> list[Trial]:
    low, high = BATCHES
    trials = []
    for _ in range(n):
        batch = int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
        estimate = model.planned_mb(batch)
        true = estimate * math.exp(rng.gauss(0.0, spread))
        trials.append(Trial(batch, estimate, true, rng.uniform(60, 180)))
    return trials


@dataclass
class Result:
    completed: int = 0
    ooms: int = 0
    late_ooms: int = 0  # OOMs of trials after the first WARM_UP
    lost: int = 0
    hours: float = 0.0

    @property
    def per_hour(self) -> float:
        return self.completed / self.hours if self.hours else 0.0


# --- this project's pool: the real loop -------------------------------------------------------


def run_pool(trials: list[Trial], plan: GpuPlan, *, learn: bool) -> Result:
    study = SimulatedStudy(budget=len(trials), max_retries=MAX_RETRIES)
    backend = SimulatedTrials(
        study,
        [SimTrial(t.batch_size, t.true_mb, t.seconds) for t in trials],
        [plan.device],
        allocate_after_s=ALLOCATE_AFTER_S,
    )
    pool = Pool(
        study=study,
        plans=[plan],
        probe=backend,
        backend=backend,
        clock=backend.clock,
        grace_s=0,
        learn=learn,
    )
    pool.run()
    return Result(
        completed=study.complete,
        ooms=backend.ooms,
        late_ooms=sum(1 for index in backend.oomed if index >= WARM_UP),
        lost=study.failed,
        hours=backend.now / 3600,
    )


# --- reference strategies: their own small event loop ----------------------------------------


def simulate(trials: list[Trial], strategy: str, *, slots: int, cores: int, swarm: int) -> Result:
    """Start trials in order while the strategy allows; (end, seq, index, oom, held) in a heap."""
    queue = [(i, 0) for i in range(len(trials))][::-1]  # (trial index, retries so far)
    running: list[tuple] = []
    used, now, sequence, result = 0.0, 0.0, 0, Result()
    policy = SlotPolicy.start(slots)

    def limit() -> int:
        return {"fixed": cores, "equal slots": policy.slots}.get(strategy, swarm)

    while queue or running:
        while queue and len(running) < limit():
            index, retries = queue[-1]
            true = trials[index].true_mb
            if strategy == "oracle" and used + true > GPU_MB:
                break
            if strategy == "oracle80" and used + true > GPU_MB * 0.8:
                break
            if strategy == "equal slots":
                policy, _ = before_spawn(policy, free_mb=GPU_MB - used, total_mb=GPU_MB)
                if len(running) >= policy.slots:
                    break
            queue.pop()
            oom = used + true > GPU_MB  # what the oracles never let happen
            used += 0.0 if oom else true
            end = now + (ALLOCATE_AFTER_S if oom else trials[index].seconds)
            sequence += 1
            started, at_start = policy.started, policy.slots
            heapq.heappush(running, (end, sequence, index, oom, true, retries, started, at_start))
            policy = policy.trial_started()
        end, _, index, oom, true, retries, started, at_start = heapq.heappop(running)
        now = end
        if oom:
            result.ooms += 1
            result.late_ooms += index >= WARM_UP
            if strategy == "equal slots" and retries < MAX_RETRIES:
                queue.append((index, retries + 1))
            else:
                result.lost += 1
        else:
            used -= true
            result.completed += 1
        if strategy == "equal slots":
            policy, _ = after_trial(policy, oom=oom, started_index=started, slots_at_start=at_start)
    result.hours = now / 3600
    return result


# --- placement: spread first against first fit, compute shared ------------------------------

HOSTS = {  # GPU memory in MB: mixed sizes, as hosts that were filled over the years
    2: [12288, 24576],
    8: [12288, 16384, 24576, 24576, 40960, 49152, 81920, 81920],
}
STUDY_PER_GPU = (3, 20)  # trials per GPU: a study smaller than the GPUs hold, and a long one


def run_placement(
    trials: list[Trial], sizes: list[int], policy: Policy, busy: float, model: MemoryModel
) -> tuple[float, list[int], int]:
    """The study's hours to finish, the trials each GPU ran, the OOMs."""
    devices = [
        Device(i, f"Simulated GPU {mb}", f"sim-{i}", mb, kind="sim") for i, mb in enumerate(sizes)
    ]
    plans = plan_node(devices, model, cpu_bound=False, cpu_cores=16, budget_trials=len(trials)).gpus
    study = SimulatedStudy(budget=len(trials), max_retries=MAX_RETRIES)
    backend = SimulatedTrials(
        study,
        [SimTrial(t.batch_size, t.true_mb, t.seconds) for t in trials],
        devices,
        allocate_after_s=ALLOCATE_AFTER_S,
        busy_fraction=busy,
    )
    pool = Pool(
        study=study,
        plans=list(plans),
        probe=backend,
        backend=backend,
        clock=backend.clock,
        grace_s=0,
        placement=policy,
    )
    pool.run()
    return backend.now / 3600, backend.admitted_on, backend.ooms


def placement_table(args: argparse.Namespace) -> None:
    model = MemoryModel(args.overhead_mb, args.per_sample_mb)
    rows = []
    for gpus, sizes in HOSTS.items():
        for per_gpu in STUDY_PER_GPU:
            for busy in args.busy:
                hours: dict[Policy, list[float]] = {Policy.SPREAD: [], Policy.FIRST_FIT: []}
                idle: dict[Policy, list[int]] = {Policy.SPREAD: [], Policy.FIRST_FIT: []}
                ooms: dict[Policy, int] = {Policy.SPREAD: 0, Policy.FIRST_FIT: 0}
                for seed in range(args.seeds):
                    rng = random.Random(seed)
                    trials = make_trials(per_gpu * gpus, model, 0.25, rng)
                    for policy in hours:
                        h, ran, oom = run_placement(trials, sizes, policy, busy, model)
                        hours[policy].append(h)
                        ooms[policy] += oom
                        idle[policy].append(sum(1 for n in ran if n == 0))
                spread = statistics.median(hours[Policy.SPREAD])
                first = statistics.median(hours[Policy.FIRST_FIT])
                rows.append(
                    {
                        "gpus": gpus,
                        "trials": per_gpu * gpus,
                        "busy_fraction": busy,
                        "spread_first_min": round(spread * 60, 1),
                        "first_fit_min": round(first * 60, 1),
                        "first_fit_over_spread": round(first / spread, 3),
                        "idle_gpus_spread": max(idle[Policy.SPREAD]),
                        "idle_gpus_first_fit": max(idle[Policy.FIRST_FIT]),
                        "ooms_spread": ooms[Policy.SPREAD],  # all seeds together
                        "ooms_first_fit": ooms[Policy.FIRST_FIT],
                    }
                )
    print(
        f"time to finish a study (minutes, median of {args.seeds} seeds); trials 60-180 s alone, "
        f"model {model.model_overhead_mb:.0f} MB + {model.per_sample_mb} MB/sample, spread 0.25"
    )
    print(
        f"{'GPUs':>4} {'trials':>6} {'busy':>5} {'spread first':>12} {'first fit':>10} "
        f"{'ratio':>6} {'idle GPUs':>9} {'OOMs':>7}"
    )
    for row in rows:
        print(
            f"{row['gpus']:>4} {row['trials']:>6} {row['busy_fraction']:>5} "
            f"{row['spread_first_min']:>12} {row['first_fit_min']:>10} "
            f"{row['first_fit_over_spread']:>6.2f} "
            f"{row['idle_gpus_spread']:>5} / {row['idle_gpus_first_fit']} "
            f"{row['ooms_spread']:>3} / {row['ooms_first_fit']}"
        )
    print(
        "ratio: first fit's time over spread first's (above 1: spread first is faster); idle "
        "GPUs: the most that ran no trial, in any seed; OOMs: all seeds together; "
        "each as spread first / first fit"
    )
    hosts = {str(k): v for k, v in HOSTS.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "hosts": hosts, "rows": rows}, indent=2)
    )
    print(f"wrote {args.out}")


# --- the table ------------------------------------------------------------------------------


def run_all(args: argparse.Namespace) -> tuple[list[dict], dict]:
    model = MemoryModel(args.overhead_mb, args.per_sample_mb)
    device = Device(0, "Simulated GPU", "sim-0", GPU_MB, kind="sim")
    plan_args = {"cpu_bound": False, "cpu_cores": args.cpu_count, "swarm_size": args.swarm}
    (plan,) = plan_node([device], model, **plan_args).gpus
    (one,) = plan_node([device], model, concurrency=1, **plan_args).gpus
    old = HardwareBudget(GPU_MB).plan_hyperopt(
        model.model_overhead_mb, model.per_sample_mb, *BATCHES, args.swarm
    )
    rows = []
    for spread in args.spreads:
        per: dict[str, list[Result]] = {name: [] for name in STRATEGIES}
        for seed in range(args.seeds):
            trials = make_trials(args.trials, model, spread, random.Random(seed))
            per["sequential"].append(run_pool(trials, one, learn=True))
            per["bytes, fixed"].append(run_pool(trials, plan, learn=False))
            per["bytes, learning"].append(run_pool(trials, plan, learn=True))
            for name in ("fixed", "equal slots", "oracle80", "oracle"):
                per[name].append(
                    simulate(
                        trials,
                        name,
                        slots=old.max_concurrent_trials,
                        cores=args.cpu_count,
                        swarm=args.swarm,
                    )
                )
        oracle = statistics.median(r.per_hour for r in per["oracle"])
        oracle80 = statistics.median(r.per_hour for r in per["oracle80"])
        for name in STRATEGIES:
            results = per[name]
            rate = statistics.median(r.per_hour for r in results)
            rows.append(
                {
                    "spread": spread,
                    "strategy": name,
                    "trials_per_hour": round(rate, 1),
                    "vs_oracle": round(rate / oracle, 3),
                    "vs_oracle80": round(rate / oracle80, 3),
                    "ooms": statistics.median(r.ooms for r in results),
                    "late_ooms": statistics.median(r.late_ooms for r in results),
                    "late_ooms_max": max(r.late_ooms for r in results),
                    "lost": statistics.median(r.lost for r in results),
                    "lost_max": max(r.lost for r in results),
                }
            )
    setup = {
        "model": [model.model_overhead_mb, model.per_sample_mb],
        "plan_max_trials": plan.slots,
        "plan_batch_bounds": list(plan.batch_bounds),
        "equal_slots": old.max_concurrent_trials,
    }
    return rows, setup


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--spreads", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    parser.add_argument(
        "--cpu-count", type=int, default=16, help="the fixed strategy's slots (a GPU node's cores)"
    )
    parser.add_argument("--overhead-mb", type=float, default=1500.0)
    parser.add_argument("--per-sample-mb", type=float, default=1.0)
    parser.add_argument("--swarm", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/pool.json")
    parser.add_argument(
        "--placement", action="store_true", help="spread first against first fit on 2 and 8 GPUs"
    )
    parser.add_argument("--busy", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    args = parser.parse_args()
    logging.getLogger("orchestrator").setLevel(logging.ERROR)  # the pool's own log lines
    if args.placement:
        if args.out == parser.get_default("out"):
            args.out = "benchmarks/results/pool_placement.json"
        placement_table(args)
        return

    rows, setup = run_all(args)
    print(
        f"GPU {GPU_MB} MB; model {setup['model'][0]:.0f} MB + {setup['model'][1]} MB/sample; "
        f"batch sizes {BATCHES[0]}..{BATCHES[1]} (log); bytes: at most {setup['plan_max_trials']}"
        f" at once, batch bounds {tuple(setup['plan_batch_bounds'])}; equal slots: "
        f"{setup['equal_slots']}; {args.trials} trials, median of {args.seeds} seeds"
    )
    header = (
        f"{'spread':>6} {'strategy':<16} {'trials/h':>9} {'vs oracle':>9} {'vs 80%':>7} "
        f"{'OOMs':>6} {'late OOMs':>9} {'max':>4} {'lost':>5} {'max':>4}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['spread']:>6} {row['strategy']:<16} {row['trials_per_hour']:>9} "
            f"{row['vs_oracle']:>9.0%} {row['vs_oracle80']:>7.0%} {row['ooms']:>6} "
            f"{row['late_ooms']:>9} {row['late_ooms_max']:>4} {row['lost']:>5} {row['lost_max']:>4}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "setup": setup, "rows": rows}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
