"""`--directions` and `--objectives`: what a study of several objectives optimises, as typed.

The rule for names and directions is orchestrator.record.study.objectives'; here the flags are
declared and what was typed becomes the spec's `direction`, `directions` and `objectives`, or
one line saying what to type instead.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from adapters import metric_name
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.study.objectives import MEASURED, parse_names, plan_objectives
from samplers import sampler_kind

if TYPE_CHECKING:
    from orchestrator import enqueue
    from orchestrator.record.study import grid as study_grid
else:
    # Used when the flags are checked, not when `--help` builds the parser.
    enqueue = LazyImport("orchestrator.enqueue")
    study_grid = LazyImport("orchestrator.record.study.grid")


def add_objective_arguments(parser: argparse.ArgumentParser) -> None:
    """Several objectives: the adapter's own values' directions, and what the study optimises."""
    parser.add_argument(
        "--directions",
        metavar="D1,D2",
        help="minimize or maximize for each value the adapter returns (default: its direction)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        metavar="NAME=V1,V2",
        help="--sampler grid: the values of a parameter (repeat it; the others stay at the "
        "adapter's defaults); in --config, a table such as grid = {learning_rate = [0.001, 0.01]}",
    )
    parser.add_argument(
        "--objectives",
        metavar="NAMES",
        help=f"what the study optimises: the adapter's metric, then any of {', '.join(MEASURED)} "
        "(minimised), as in sharpe,vram_peak_mb,seconds; `best` shows the Pareto front",
    )


def objectives_of(args: argparse.Namespace, adapter: Any, options: dict[str, Any]) -> dict:
    """The spec's direction, directions and objectives from --directions and --objectives."""
    try:
        directions = parse_names(args.directions, "--directions") if args.directions else None
        objectives = parse_names(args.objectives, "--objectives") if args.objectives else None
        names, all_directions = plan_objectives(
            objectives,
            directions,
            metric=metric_name(adapter, options),
            direction=adapter.direction,
        )
    except ValueError as error:
        message = str(error)  # plan_objectives speaks of `objectives`, the API's word
        if message.startswith("objectives "):
            message = "--" + message
        raise UserError(message) from None
    returned = _values_returned(adapter)
    if directions is not None and len(directions) != len(returned):
        raise UserError(
            f"--directions {args.directions}: adapter {adapter.name!r} returns "
            f"{len(returned)} value(s) ({'/'.join(returned)}): give one direction for each"
        )
    several = len(all_directions) > 1
    return {
        "direction": all_directions[0],
        "directions": all_directions if several else None,
        "objectives": names if several else None,
    }


def _values_returned(adapter: Any) -> list[str]:
    """The directions of the values the adapter's objective returns: its `directions` when it
    declares several, else its one `direction` (an Adapter's `train` returns one float)."""
    declared = getattr(adapter, "directions", None)
    if declared:
        return [str(d) for d in declared]
    return [str(adapter.direction)]


def grid_of(args: argparse.Namespace, adapter: Any, options: dict[str, Any]) -> dict:
    """The spec's grid (and, when --trials is not typed, the budget of one walk of it) for
    `--sampler grid`; --grid without it is refused, and so is a value outside the adapter's
    search space (before anything is stored: GridSampler would only find it in each trial)."""
    if not sampler_kind(args.sampler).needs_grid:
        if args.grid:
            raise UserError("--grid is the grid of --sampler grid: add --sampler grid")
        return {}
    try:
        grid = study_grid.full_grid(
            study_grid.parse_grid(args.grid or []), getattr(adapter, "default_params", {})
        )
    except ValueError as error:
        raise UserError(str(error)) from None
    if not grid:
        raise UserError("--sampler grid needs --grid NAME=V1,V2 (or a grid table in --config)")
    space = enqueue.search_space(adapter, options)
    for name, values in grid.items():
        if name in space:  # a default that is no searched parameter is passed as it is
            grid[name] = [enqueue.checked_params({name: v}, space, "--grid")[name] for v in values]
    return {"grid": grid, "trials": args.trials or study_grid.grid_size(grid)}
