"""How many trials an hour a GPU gets through, and how many it loses, under four ways of filling it.

A discrete-event simulation of one simulated 24 GB GPU fed a stream of trials whose true memory
differs from the memory model's estimate by a random factor (log-normal, `--spread`). Each way
of filling the GPU sees the same trials in the same order:

- sequential: one trial at a time;
- fixed: as many at once as the node has CPU cores (the seed's starting point), no protection:
  a trial that runs out of memory is lost;
- pool: this project's supervisor itself: `orchestrator.pool.Pool`, the loop `run` uses, on
  a simulated backend and a virtual clock (`orchestrator.simulated_backend`), with its plan from
  `orchestrator.planner` (ramp-up from half, halving on OOM, the free-VRAM watchdog, re-queueing
  an OOM'd trial up to twice);
- oracle: knows every trial's true memory and starts a trial whenever it fits, up to the same
  swarm-size cap; it never runs out of memory. It fills the GPU to the last MB, which a real
  allocator cannot; "oracle 80%" knows the same but keeps the planner's 20% for the allocator,
  so the gap between the two is the price of that reserve, not of the estimate being wrong.

A trial that does not fit runs out of memory a few seconds after it starts; the time until then
is lost. The simulation measures the policy, not process start-up (see tests for the processes).

    python benchmarks/bench_pool.py                # 200 trials, spreads 0.1 0.25 0.5, 10 seeds
    python benchmarks/bench_pool.py --seeds 3      # quicker
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

from adapters.base import MemoryModel
from orchestrator.gpu.base import Device
from orchestrator.planner import GpuPlan, plan_node
from orchestrator.pool import Pool
from orchestrator.simulated_backend import SimTrial, SimulatedStudy, SimulatedTrials

GPU_MB = 24576
OOM_AFTER_S = 5.0  # an allocation fails early in a trial: model and first batch
MAX_RETRIES = 2


@dataclass(frozen=True)
class Trial:
    batch_size: int
    estimate_mb: float
    true_mb: float
    seconds: float


def make_trials(
    n: int, model: MemoryModel, bounds: tuple[int, int], spread: float, rng: random.Random
) -> list[Trial]:
    trials = []
    low, high = bounds
    for _ in range(n):
        batch = int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
        estimate = model.planned_mb(batch)
        trials.append(
            Trial(
                batch, estimate, estimate * math.exp(rng.gauss(0.0, spread)), rng.uniform(60, 180)
            )
        )
    return trials


@dataclass
class Result:
    completed: int = 0
    ooms: int = 0
    lost: int = 0
    hours: float = 0.0

    @property
    def per_hour(self) -> float:
        return self.completed / self.hours if self.hours else 0.0


def simulate(
    trials: list[Trial], strategy: str, *, max_slots: int, cpu_count: int, swarm: int
) -> Result:
    """The reference strategies' event loop: (finish time, sequence, trial index, oom?) in a
    heap, a virtual clock. (The pool itself runs in `run_pool`.)"""
    queue = [(i, 0) for i in range(len(trials))]  # (trial index, retries so far)
    # Only the pool re-runs what ran out of memory; every other strategy loses it.
    queue.reverse()
    running: list[tuple[float, int, int, bool, float]] = []
    used = 0.0
    now = 0.0
    result = Result()
    sequence = 0

    def limit() -> int:
        return {
            "sequential": 1,
            "fixed": cpu_count,
            "oracle": swarm,
            "oracle80": swarm,
        }[strategy]

    while queue or running:
        while queue and len(running) < limit():
            index, _ = queue[-1]
            trial = trials[index]
            if strategy == "oracle" and used + trial.true_mb > GPU_MB:
                break
            if strategy == "oracle80" and used + trial.true_mb > GPU_MB * 0.8:
                break
            queue.pop()
            oom = used + trial.true_mb > GPU_MB
            if not oom:
                used += trial.true_mb
            finish = now + (OOM_AFTER_S if oom else trial.seconds)
            sequence += 1
            heapq.heappush(running, (finish, sequence, index, oom, trial.true_mb))
        finish, _, index, oom, true_mb = heapq.heappop(running)
        now = finish
        if oom:
            result.ooms += 1
            result.lost += 1
        else:
            used -= true_mb
            result.completed += 1
    result.hours = now / 3600
    return result


def run_pool(trials: list[Trial], plan: GpuPlan) -> Result:
    """The supervisor's own loop on simulated trials and a virtual clock."""
    study = SimulatedStudy(budget=len(trials), max_retries=MAX_RETRIES)
    backend = SimulatedTrials(
        study,
        [SimTrial(t.batch_size, t.true_mb, t.seconds) for t in trials],
        [plan.device],
        oom_after_s=OOM_AFTER_S,
    )
    Pool(
        study=study, plans=[plan], probe=backend, backend=backend, clock=backend.clock, grace_s=0
    ).run()
    return Result(
        completed=study.complete, ooms=backend.ooms, lost=study.failed, hours=backend.now / 3600
    )


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
    args = parser.parse_args()

    logging.getLogger("orchestrator").setLevel(logging.ERROR)  # the pool's own log lines
    model = MemoryModel(args.overhead_mb, args.per_sample_mb)
    device = Device(0, "Simulated GPU", "sim-0", GPU_MB, kind="sim")
    (gpu_plan,) = plan_node(
        [device], model, cpu_bound=False, cpu_cores=args.cpu_count, swarm_size=args.swarm
    ).gpus
    plan = gpu_plan.strategy
    strategies = ("sequential", "fixed", "pool", "oracle80", "oracle")
    rows = []
    for spread in args.spreads:
        per = {name: [] for name in strategies}
        for seed in range(args.seeds):
            trials = make_trials(
                args.trials, model, gpu_plan.batch_bounds, spread, random.Random(seed)
            )
            for name in strategies:
                if name == "pool":
                    per[name].append(run_pool(trials, gpu_plan))
                    continue
                per[name].append(
                    simulate(
                        trials,
                        name,
                        max_slots=plan.max_concurrent_trials,
                        cpu_count=args.cpu_count,
                        swarm=args.swarm,
                    )
                )
        oracle = statistics.median(r.per_hour for r in per["oracle"])
        for name in strategies:
            results = per[name]
            rate = statistics.median(r.per_hour for r in results)
            rows.append(
                {
                    "vs_oracle80": round(
                        rate / statistics.median(r.per_hour for r in per["oracle80"]), 3
                    ),
                    "spread": spread,
                    "strategy": name,
                    "trials_per_hour": round(rate, 1),
                    "vs_oracle": round(rate / oracle, 3),
                    "ooms": statistics.median(r.ooms for r in results),
                    "lost": statistics.median(r.lost for r in results),
                    "lost_max": max(r.lost for r in results),
                }
            )
    header = f"{'spread':>6} {'strategy':<10} {'trials/h':>9} {'vs oracle':>9} {'vs 80%':>7} {'OOMs':>6} {'lost':>5} {'lost max':>8}"
    print(
        f"GPU {GPU_MB} MB; model {model.model_overhead_mb:.0f} MB + {model.per_sample_mb} MB/sample; "
        f"plan {plan.max_concurrent_trials} slots, batch {plan.batch_size_bounds}; "
        f"{args.trials} trials, median of {args.seeds} seeds"
    )
    print(header)
    for row in rows:
        print(
            f"{row['spread']:>6} {row['strategy']:<10} {row['trials_per_hour']:>9} {row['vs_oracle']:>9.0%} {row['vs_oracle80']:>7.0%} "
            f"{row['ooms']:>6} {row['lost']:>5} {row['lost_max']:>8}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"args": vars(args), "plan_slots": plan.max_concurrent_trials, "rows": rows}, indent=2
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
