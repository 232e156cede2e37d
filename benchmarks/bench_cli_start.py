"""How long the command line takes to answer before it does any work: `--help` and `run --help`.

Each command runs as a user runs it (`python -m orchestrator ...`, a fresh interpreter each
time) against this tree and, with `--against REF`, against another commit checked out into a
temporary git worktree (run with PYTHONPATH on it, so the same interpreter and packages serve
both). The trees take turns, so load on a shared machine falls on each alike. The figures are
the child's CPU time (user + system, from `resource.getrusage(RUSAGE_CHILDREN)`), steadier than
wall time on a busy machine, and its wall time; medians of `--repeats`, and the least CPU time,
the figure least touched by other work.

Target: this tree's `--help` no slower than the commit it is compared with.

    python benchmarks/bench_cli_start.py                          # this tree only
    python benchmarks/bench_cli_start.py --against a9c36fb        # against an earlier commit
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (("--help",), ("run", "--help"))


def run_once(tree: Path, args: tuple[str, ...]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `python -m orchestrator ARGS` on `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    # As an installed package runs: from its .pyc files (the first, uncounted run writes them),
    # not compiled from source each time, which would weigh a module by its length.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=tempfile.gettempdir(),  # not the repository: `orchestrator` comes from PYTHONPATH
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


@contextlib.contextmanager
def checked_out(ref: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="orchestrator-cli-start-"))
    tree = folder / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), ref], check=True
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
        )


def measure(trees: dict[str, Path], repeats: int) -> list[dict]:
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for tree in trees.values():  # the first run of a tree writes its .pyc files: not counted
        for args in COMMANDS:
            run_once(tree, args)
    for repeat in range(repeats):
        for args in COMMANDS:
            order = list(trees.items())
            for name, tree in order if repeat % 2 == 0 else reversed(order):  # neither always first
                samples.setdefault((name, " ".join(args)), []).append(run_once(tree, args))
    return [
        {
            "tree": name,
            "command": command,
            "cpu_ms": round(1000 * statistics.median(cpu for cpu, _ in runs), 1),
            "cpu_ms_min": round(1000 * min(cpu for cpu, _ in runs), 1),
            "wall_ms": round(1000 * statistics.median(wall for _, wall in runs), 1),
            "repeats": len(runs),
        }
        for (name, command), runs in samples.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REF", help="a commit to compare this tree with")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cli_start.json")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        trees = {"this tree": ROOT}
        if args.against:
            trees[args.against] = stack.enter_context(checked_out(args.against))
        rows = measure(trees, args.repeats)
    print(f"{'command':<12} {'tree':<10} {'CPU ms':>7} {'min CPU ms':>11} {'wall ms':>8}")
    for row in rows:
        print(
            f"{row['command']:<12} {row['tree']:<10} {row['cpu_ms']:>7} "
            f"{row['cpu_ms_min']:>11} {row['wall_ms']:>8}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {"this tree": f"{head} and its uncommitted changes", "repeats": args.repeats}
    args.out.write_text(json.dumps({**result, "rows": rows}, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
