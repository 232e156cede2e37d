"""What fusing N forecaster (`tft`) trials into one model buys, measured
(docs/fused_tft.md).

End to end, the real thing: `tft.adapter.train_fused` against `train`. For each draw, 8 trials'
parameters from the study's default search space (`tft.adapter.suggest` with the default
options, a random sampler seeded by the draw): the first drawn freely, the other 7 with its
`fuse_key` parameters (width, depth, window, batch size) and the rest drawn, as the pool asks a
group. The 8 train for `--epochs` in groups of N = 1 (each alone with `train`), 2, 4, 8, one
group after another; trials per CPU-second of this process on a CPU (one torch thread, as a
trial process runs; the machine is shared, so wall time would count others' work), per wall
second on a GPU (synchronised), and the largest
relative difference of a member's value from its value alone (dropout draws its masks in
another order in a group, so only `--no-dropout` makes that a check).

`--rows`: the cost of one fused gradient step of 4 members against 4 steps alone, at one shape
and batch sizes 64 to 1024: what padding members of different batch sizes to the largest would
cost (docs/fused_tft.md, why the batch size is part of `fuse_key`).

    python benchmarks/bench_fused_tft.py              # writes benchmarks/results/fused_tft.json
    python benchmarks/bench_fused_tft.py --draws 0,1 --epochs 1 --no-dropout
    python benchmarks/bench_fused_tft.py --device cuda  # wall seconds, synchronised
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna
import torch

from adapters import _tft_fused, tft
from adapters.base import Member, parse_options

RESULTS = Path(__file__).resolve().parent / "results"


def drawn_members(count: int, seed: int, *, no_dropout: bool) -> list[dict[str, Any]]:
    """`count` trials' parameters: the first drawn freely, the others with its shape fixed."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = parse_options(tft.adapter, {})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    draws = [tft.adapter.suggest(study.ask(), options) for _ in range(count)]
    shape = {name: draws[0][name] for name in _tft_fused.KEYED}
    members = [{**params, **shape} for params in draws]
    if no_dropout:
        members = [{**params, "dropout": 0.0} for params in members]
    return members


def end_to_end(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The 8 members of draw `seed` in groups of N, one group after another, for each N."""
    params = drawn_members(8, seed, no_dropout=args.no_dropout)
    options = parse_options(tft.adapter, {})
    shape = {name: params[0][name] for name in _tft_fused.KEYED}
    print(f"draw {seed}: {shape}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for n in (int(x) for x in args.groups.split(",")):
        cpu, got = _clock(args.device), []
        for start in range(0, len(params), n):
            members = [Member(p, lambda e, v: None, None) for p in params[start : start + n]]
            with contextlib.redirect_stdout(io.StringIO()):  # the trial log's lines
                entries = tft.adapter.train_fused(
                    members, epochs=args.epochs, device=torch.device(args.device), options=options
                )
            for entry in entries:
                if isinstance(entry, BaseException):
                    raise entry
            got += entries
        cpu = _clock(args.device) - cpu
        rows.append(
            {"members_per_group": n, "cpu_s": cpu, "trials_per_cpu_s": 8 / cpu, "values": got}
        )
        print(f"  groups of {n}: {cpu:.1f} s", file=sys.stderr, flush=True)
    alone = rows[0]["values"]
    for row in rows:
        row["largest_relative_difference"] = max(
            abs(a - b) / abs(b) for a, b in zip(row["values"], alone, strict=True)
        )
    return {"draw": seed, "shape": shape, "params": params, "rows": rows}


def _warm_up(args: argparse.Namespace) -> None:
    """One epoch alone and in a group at the smallest shape, untimed: what the first call of
    each path loads once (torch.func, the kernels) is not charged to the first draw."""
    small = {**tft.adapter.default_params, "width": 16, "window": 16, "depth": 1, "batch_size": 64}
    members = [Member(small, lambda e, v: None, None) for _ in range(2)]
    options = parse_options(tft.adapter, {})
    with contextlib.redirect_stdout(io.StringIO()):
        for group in (members[:1], members):
            tft.adapter.train_fused(
                group, epochs=1, device=torch.device(args.device), options=options
            )


def step_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One fused step of 4 members against 4 steps alone, ms, at batch sizes 64..1024."""
    device = torch.device(args.device)
    from adapters.tft import _TrainingStep

    options = parse_options(tft.adapter, {})
    out = []
    for batch in (64, 256, 1024):
        params = {**tft.adapter.default_params, "width": 64, "window": 32, "depth": 1}
        params = {**params, "batch_size": batch, "dropout": 0.0}
        forecasting = _tft_fused.Forecasting(_TrainingStep, tft._sizes)
        data = _tft_fused._Data(tft.adapter, forecasting, params, options, device)
        members = [Member(params, lambda e, v: None, None) for _ in range(4)]
        runs = [
            _tft_fused._Run(i, m, tft.adapter.default_params, data) for i, m in enumerate(members)
        ]
        group = _tft_fused._Group(runs, data)
        fused = _per_call(group.step, args.rounds, args.device)
        alone = [_TrainingStep(run.model, params, device) for run in runs]
        batch_of = data.batch(data.train_starts[:batch])
        separate_ms = _per_call(_one_after_another(alone, batch_of), args.rounds, args.device)
        out.append({"batch_size": batch, "fused_ms": fused, "separate_ms": separate_ms})
        print(
            f"  batch {batch}: fused {fused:.1f} ms, separate {separate_ms:.1f} ms", file=sys.stderr
        )
    return out


def _one_after_another(steps: list[Any], batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
    def call() -> None:
        for step in steps:
            step(*batch)

    return call


def _per_call(call: Any, rounds: int, device: str) -> float:
    call()  # the first call pays for what is built once
    started = _clock(device)
    for _ in range(rounds):
        call()
    return (_clock(device) - started) / rounds * 1e3


def _clock(device: str) -> float:
    """CPU seconds of this process on a CPU (others' work on a shared machine is not ours);
    wall seconds once the GPU has finished what it was given, on a GPU."""
    if device == "cpu":
        return time.process_time()
    torch.cuda.synchronize()
    return time.perf_counter()


def table(draws: list[dict[str, Any]]) -> list[str]:
    groups = [row["members_per_group"] for row in draws[0]["rows"]]
    head = "| draw | width | depth | window | batch | " + " | ".join(f"N = {n}" for n in groups)
    lines = [
        "trials per second (x N = 1):",
        "",
        head + f" | largest value difference at N = {groups[-1]} |",
        "|---:|---:|---:|---:|---:|" + "---:|" * len(groups) + "---:|",
    ]
    for draw in draws:
        shape, rows = draw["shape"], draw["rows"]
        cells = [
            f"{r['trials_per_cpu_s']:.2f} (x{r['trials_per_cpu_s'] / rows[0]['trials_per_cpu_s']:.2f})"
            for r in rows
        ]
        lines.append(
            f"| {draw['draw']} | {shape['width']} | {shape['depth']} | {shape['window']} | "
            f"{shape['batch_size']} | "
            + " | ".join(cells)
            + f" | {rows[-1]['largest_relative_difference']:.1e} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", default="0,1,2,3,4,5", help="draw seeds, comma-separated")
    parser.add_argument("--groups", default="1,2,4,8", help="group sizes N")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-dropout", action="store_true", help="every member's dropout 0")
    parser.add_argument("--rounds", type=int, default=5, help="--rows: steps timed per case")
    parser.add_argument("--rows", action="store_true", help="also the fused step against rows")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (a GPU: wall time)")
    parser.add_argument("--out", default=None, help="default: results/fused_tft[_cuda].json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a trial process trains
    warnings.filterwarnings("ignore", message="There is a performance drop")
    _warm_up(args)
    draws = [end_to_end(int(seed), args) for seed in args.draws.split(",")]
    steps = step_rows(args) if args.rows else []
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    machine = f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    machine += f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ", cpu"
    lines = [f"Machine: {machine}; one torch thread. Load at the end: `{load}`", ""]
    lines += table(draws)
    if steps:
        lines += [
            "",
            "| batch | fused step of 4, ms | 4 steps alone, ms | x alone |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {s['batch_size']} | {s['fused_ms']:.1f} | {s['separate_ms']:.1f} | "
            f"{s['separate_ms'] / s['fused_ms']:.2f} |"
            for s in steps
        ]
    print("\n".join(lines))
    result = {
        "command": " ".join(sys.argv),
        "machine": machine,
        "uptime": load,
        "epochs": args.epochs,
        "draws": draws,
        "steps": steps,
    }
    name = "fused_tft.json" if args.device == "cpu" else f"fused_tft_{args.device}.json"
    Path(args.out or RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
