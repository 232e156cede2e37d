"""Fused trials as a user meets them: the same study run by the command line under several pool
settings, DQN and PPO on CartPole-v1, the study's default search space, seed after seed.

    python benchmarks/bench_fused_cli.py                                  # the CPU target
    python benchmarks/bench_fused_cli.py --gpus 0 --trials 32 \\
        --settings fuse=1:concurrency=1 fuse=1 fuse=8 fuse=auto           # the GPU targets

Each run is `python -m orchestrator run ALGO --env CartPole-v1 --trials T --epochs 2 --option
steps_per_epoch=4000 --gpus G --seed S` plus a setting's flags (`fuse=8:concurrency=1` is
`--fuse 8 --concurrency 1`), on a fresh SQLite file. The settings of one seed run back to back,
their order turned from seed to seed, so a change of the machine's load hits them all. Two
figures per run: the trials' span (the first trial's start to the last one's end: what the pool
settings change), as trials (complete or pruned) per hour, and the whole command's wall time
(with the unfused test run of the best trial and the baselines after the study). The table gives medians, and the
median over seeds of each setting's ratio to the first one (above 1: sooner / more per hour).

The targets: on a 2-core CPU, `--fuse 8` finishes the 8-trial command 2.5x sooner than
`--fuse 1` (the default settings); on a GPU, `--fuse` gives 8x the trials per hour of one trial
per GPU (`fuse=1:concurrency=1`) and 3x the packed pool's (`fuse=1`).
Results: benchmarks/results/fused_cli[_GPUS].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def setting_flags(setting: str) -> list[str]:
    """`fuse=8:concurrency=1` as `--fuse 8 --concurrency 1`."""
    flags: list[str] = []
    for part in setting.split(":"):
        name, _, value = part.partition("=")
        flags += [f"--{name}", value]
    return flags


def command(
    algo: str, flags: list[str], seed: int, url: str, args: argparse.Namespace
) -> list[str]:
    return [
        sys.executable, "-m", "orchestrator", "run", algo, "--env", "CartPole-v1",
        "--trials", str(args.trials), "--epochs", "2", "--option", "steps_per_epoch=4000",
        "--gpus", args.gpus, *flags, "--seed", str(seed), "--storage", url,
    ]  # fmt: skip


def one_run(algo: str, setting: str, seed: int, folder: Path, args: argparse.Namespace) -> dict:
    name = f"{algo}-{setting.replace(':', '_')}-{seed}.db"
    url = f"sqlite:///{folder / name}"
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(
        command(algo, setting_flags(setting), seed, url, args),
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{algo} {setting} --seed {seed} failed:\n{done.stderr[-2000:]}")
    trials = optuna.load_study(study_name=algo, storage=url).trials
    span = max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)
    state = optuna.trial.TrialState
    complete = [t for t in trials if t.state == state.COMPLETE]
    finished = [t for t in trials if t.state in (state.COMPLETE, state.PRUNED)]
    return {
        "algo": algo,
        "setting": setting,
        "seed": seed,
        "wall_s": round(wall, 2),
        "trials_span_s": round(span.total_seconds(), 2),
        "complete": len(complete),
        "finished": len(finished),  # complete or pruned: what a trial per hour counts
        "fused": sum(bool(t.user_attrs.get("fused_with")) for t in complete),
        "load_before": round(load, 2),
    }


def table(runs: list[dict], settings: list[str]) -> str:
    first = settings[0]
    lines = [
        f"| algo | setting | trials' span (s) | trials per hour | command (s) "
        f"| x {first}: per hour | x {first}: command | complete / fused, per seed |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for algo in sorted({r["algo"] for r in runs}):
        base = {r["seed"]: r for r in runs if r["algo"] == algo and r["setting"] == first}
        for setting in settings:
            mine = {r["seed"]: r for r in runs if r["algo"] == algo and r["setting"] == setting}
            seeds = sorted(base.keys() & mine.keys())
            span = statistics.median(mine[s]["trials_span_s"] for s in seeds)
            wall = statistics.median(mine[s]["wall_s"] for s in seeds)
            per_hour = statistics.median(
                mine[s]["finished"] / mine[s]["trials_span_s"] * 3600 for s in seeds
            )
            faster = statistics.median(
                (mine[s]["finished"] / mine[s]["trials_span_s"])
                / (base[s]["finished"] / base[s]["trials_span_s"])
                for s in seeds
            )
            sooner = statistics.median(base[s]["wall_s"] / mine[s]["wall_s"] for s in seeds)
            counts = ", ".join(f"{mine[s]['complete']}/{mine[s]['fused']}" for s in seeds)
            lines.append(
                f"| {algo} | {setting} | {span:.1f} | {per_hour:,.0f} | {wall:.1f} "
                f"| {faster:.2f} | {sooner:.2f} | {counts} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3", help="study seeds, comma-separated")
    parser.add_argument("--algos", default="dqn,ppo", help="adapters, comma-separated")
    parser.add_argument("--gpus", default="none", help="as `run --gpus` takes it")
    parser.add_argument("--trials", type=int, default=8, help="the study's budget")
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["fuse=1", "fuse=8"],
        help="pool settings, the first the baseline (NAME=VALUE[:NAME=VALUE...])",
    )
    parser.add_argument("--out", default=None, help="the JSON file (default: results/)")
    args = parser.parse_args()
    suffix = "" if args.gpus == "none" else "_" + args.gpus.replace(":", "_").replace(",", "_")
    out = Path(args.out or RESULTS / f"fused_cli{suffix}.json")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        for i, seed in enumerate(seeds):
            order = (
                args.settings[i % len(args.settings) :] + args.settings[: i % len(args.settings)]
            )
            for algo in args.algos.split(","):
                for setting in order:
                    runs.append(one_run(algo, setting, seed, Path(folder), args))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    text = table(runs, args.settings)
    print(text)
    print(f"\n{os.cpu_count()} cores, --gpus {args.gpus}; load at the end: {load}")
    shown = " ".join(command("ALGO", ["SETTING"], 0, "URL", args))
    record = {
        "command": shown,
        "settings": args.settings,
        "cores": os.cpu_count(),
        "load_end": load,
        "runs": runs,
        "table": text,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
