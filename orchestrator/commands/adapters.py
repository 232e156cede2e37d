"""`adapters`: what can be tuned here - name, workload class, memory model, where it came from.

A broken adapter (an import error, a missing method) is listed with its one-line reason; the
others still list, and still run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from adapters import discover, memory_model_of, metric_name, parse_options
from orchestrator.flags.common import command_parser


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "adapters",
        help="list the installed adapters: built-in, from entry points, and why any is broken",
        example="python -m orchestrator adapters --json",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per adapter, as a list"
    )
    parser.set_defaults(handler=adapters_command)


def describe(entry: Any) -> dict[str, Any]:
    """One adapter as a row: usable ones with their memory model at default options."""
    row: dict[str, Any] = {"name": entry.name, "origin": entry.origin, "target": entry.target}
    if entry.error:
        return {**row, "error": entry.error}
    adapter = entry.adapter
    try:
        options = parse_options(adapter, {})
        memory = memory_model_of(adapter, options)
    except Exception as error:  # a third party's memory_model may raise anything
        return {**row, "error": f"memory model: {type(error).__name__}: {_first_line(error)}"}
    try:
        metric = metric_name(adapter, options)
    except Exception as error:  # and so may its metric_for
        return {**row, "error": f"metric: {type(error).__name__}: {_first_line(error)}"}
    return {
        **row,
        "workload_class": adapter.workload_class,
        "direction": adapter.direction,
        "metric": metric,
        "model_overhead_mb": memory.model_overhead_mb,
        "per_sample_mb": memory.per_sample_mb,
        "description": getattr(adapter, "description", ""),
        "error": None,
    }


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def format_table(rows: list[dict[str, Any]]) -> str:
    """Aligned columns for the usable adapters, then one line per broken one."""
    header = ("NAME", "CLASS", "MEMORY MODEL", "FROM")
    good = [
        (
            row["name"],
            row["workload_class"],
            f"{row['model_overhead_mb']:,.0f} MB + {row['per_sample_mb']:.4g} MB/sample",
            row["origin"],
        )
        for row in rows
        if not row["error"]
    ]
    widths = [max(len(cells[i]) for cells in [header, *good]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [header, *good]
    ]
    lines += [
        f"{row['name']}: broken ({row['origin']}, {row['target']}): {row['error']}"
        for row in rows
        if row["error"]
    ]
    return "\n".join(lines)


def adapters_command(args: argparse.Namespace) -> int:
    rows = sorted((describe(entry) for entry in discover()), key=lambda row: row["name"])
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0
