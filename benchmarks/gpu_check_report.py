"""The GPU check's results as people read them: a table of checks on the terminal, and the
tables of docs/gpu.md (written between two markers, so the rest of the page is left alone).
Pure: a results dict in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

START = "<!-- gpu-check results: written by benchmarks/gpu_check.py -->"
END = "<!-- end of gpu-check results -->"

MARK = {True: "pass", False: "FAIL", None: "n/a"}


def check_lines(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """One aligned line per check: stage, name, pass/FAIL/n/a, detail."""
    if not checks:
        return []
    stage_w = max(len(c["stage"]) for c in checks)
    name_w = max(len(c["name"]) for c in checks)
    return [
        f"{c['stage']:<{stage_w}}  {c['name']:<{name_w}}  {MARK[c['ok']]:<4}  {c['detail']}"
        for c in checks
    ]


def _count(checks: Sequence[Mapping[str, Any]]) -> str:
    ran = [c for c in checks if c["ok"] is not None]
    passed = sum(1 for c in ran if c["ok"])
    skipped = len(checks) - len(ran)
    return f"{passed} of {len(ran)} passed" + (f", {skipped} not applicable" if skipped else "")


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} MB"


def _model(model: Mapping[str, Any] | None) -> str:
    if not model:
        return "-"
    return f"{model['model_overhead_mb']:,.0f} MB + {model['per_sample_mb']:.4g} MB/sample"


def _error(vram: Mapping[str, Any]) -> str:
    if not vram.get("compared"):
        return "-"
    return (
        f"{vram['worst_error']:+.1%} worst, {vram['median_error']:+.1%} median "
        f"({vram['compared']} trials)"
    )


def summary_table(results: Mapping[str, Any]) -> list[str]:
    """GPU, planned vs achieved trials at once, OOMs, VRAM error, seconds, checks: one row."""
    study = results.get("study") or {}
    gpu = results.get("gpu") or {}
    name = f"{gpu['name']} ({gpu['total_mb']:,.0f} MB)" if gpu else "no GPU"
    ooms = "-"
    if study:
        ooms = f"{study.get('ooms', 0)} ({study.get('cuda_ooms', 0)} from CUDA), {study.get('reruns', 0)} re-run"
    row = [
        name,
        results.get("mode", "-"),
        str(study.get("planned_at_once", "-")),
        str(study.get("achieved_at_once", "-")),
        ooms,
        _error(results.get("vram") or {}),
        f"{results.get('seconds', 0):.0f}",
        _count(results.get("checks", [])),
    ]
    header = [
        "GPU",
        "limit",
        "planned at once",
        "achieved at once",
        "OOMs",
        "VRAM error",
        "seconds",
        "checks",
    ]
    return [_row(header), _row(["---"] * len(header)), _row(row)]


def calibration_table(results: Mapping[str, Any]) -> list[str]:
    """Declared against measured memory models, per adapter, at the batch-size extremes."""
    calibration = results.get("calibration") or {}
    if not calibration:
        return []
    lines = [
        _row(["adapter", "options", "declared", "measured", "peaks measured"]),
        _row(["---"] * 5),
    ]
    for adapter, entry in calibration.items():
        peaks = ", ".join(f"batch {b}: {_mb(mb)}" for b, mb in entry.get("peaks", [])) or "-"
        options = " ".join(entry.get("options", [])) or "defaults"
        lines.append(
            _row(
                [
                    adapter,
                    options,
                    _model(entry.get("declared")),
                    _model(entry.get("measured")),
                    peaks,
                ]
            )
        )
    return lines


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"


def docs_section(results: Mapping[str, Any]) -> str:
    """What goes between the markers of docs/gpu.md."""
    lines = [START, "", *summary_table(results), ""]
    calibration = calibration_table(results)
    if calibration:
        lines += [*calibration, ""]
    when = results.get("started_at", "")
    lines.append(f"Run {when} with `{results.get('command', '')}`; every number is in")
    lines.append(f"`{results.get('results_path', 'benchmarks/results/gpu.json')}`.")
    lines += ["", END]
    return "\n".join(lines)


def replace_section(page: str, section: str) -> str:
    """`page` with its marked section replaced by `section` (appended if the page has none)."""
    if START in page and END in page:
        head, _, rest = page.partition(START)
        _, _, tail = rest.partition(END)
        return head + section + tail
    return page.rstrip("\n") + "\n\n" + section + "\n"
