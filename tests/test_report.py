"""`report`: an HTML page that opens with no network, and the same charts as PNG files."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from test_status import build_study, run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000, path


def assert_offline_page(page: Path) -> str:
    text = page.read_text()
    # Self-contained: plotly.js inline, nothing fetched from elsewhere.
    assert "Plotly.newPlot" in text and len(text) > 1_000_000
    assert not re.search(r"<script[^>]+src=", text)
    assert not re.search(r"<link[^>]+href=[\"']https?:", text)
    return text


def test_report_writes_a_page_and_pngs(storage_url, tmp_path, capsys):
    built = build_study(storage_url)
    out = tmp_path / "report"
    code, printed, _ = run_cli(
        capsys, "report", "--study", "demo", "--storage", storage_url, "--out", str(out)
    )
    assert code == 0 and str(out / "index.html") in printed
    charts = ("history", "importances", "parallel", "slice", "timeline", "memory")
    for name in (*charts, "vram", "slots"):
        assert_png(out / f"{name}.png")
    assert not (out / "contour.png").exists()  # the page's only: see orchestrator.show.report.pngs
    text = assert_offline_page(out / "index.html")
    for words in (
        "Study demo",
        "Recommended trial #",  # the configuration the model expects best (show/recommended.py)
        f"trial #{built['best']}, the best observed too: loss ",  # noiseless: the same trial
        "Optimisation history",
        "Slice",
        "Contour",
        "Trials on each GPU over time",
        "GPU memory held over time",
        "Parameter importances",
        "Parallel coordinates",
        "Batch size vs peak VRAM per GPU",
        "Slots over time",
        "NVIDIA L40S memory model (plan)",
        "history.png",
    ):
        assert words in text
    assert text.count('class="plotly-graph-div"') == 9
    # these trials reported no value per epoch: the learning curves say so instead of drawing
    assert "Learning curves" in text and "no trial has reported a value per epoch yet" in text
    assert "Objective Value" not in text  # every axis is named by the metric
    assert "importances need at least" not in text


def test_report_with_few_trials_skips_importances_with_a_note(sqlite_url, tmp_path, capsys):
    build_study(sqlite_url, completed=3)
    out = tmp_path / "r"
    code, printed, _ = run_cli(
        capsys, "report", "--study", "demo", "--storage", sqlite_url, "--out", str(out)
    )
    assert code == 0 and "importances need at least" in printed
    assert not (out / "importances.png").exists()
    assert_png(out / "history.png")
    assert "importances need at least 8" in (out / "index.html").read_text()


def test_report_to_an_unwritable_directory_is_one_line(sqlite_url, tmp_path, capsys):
    build_study(sqlite_url, completed=2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = run_cli(
        capsys,
        "report",
        "--study",
        "demo",
        "--storage",
        sqlite_url,
        "--out",
        str(blocker / "report"),
    )
    assert code == 2 and err.startswith("error: cannot write the report") and err.count("\n") == 1


def test_report_of_a_missing_study_lists_the_others(sqlite_url, tmp_path, capsys):
    build_study(sqlite_url, "only-one", completed=1)
    code, _, err = run_cli(
        capsys, "report", "--study", "x", "--storage", sqlite_url, "--out", str(tmp_path)
    )
    assert code == 2 and "only-one" in err


def _row(trial: int, *, oom: bool, planned: float | None, peak: float | None, batch: int = 512):
    from orchestrator.show.views import VramRow

    return VramRow(trial, "FAIL" if oom else "COMPLETE", "L4", 0, "h", batch, planned, peak, 2, oom)


def test_an_oom_is_plotted_at_planned_mb_as_the_legend_says():
    from test_status import _detail

    from orchestrator.show.report.chart_data import point_mb, vram_points
    from orchestrator.show.report.charts import vram_chart

    fine = _row(0, oom=False, planned=1000.0, peak=1800.0)
    oom_with_peak = _row(1, oom=True, planned=3000.0, peak=5400.0, batch=2048)
    oom_without_peak = _row(2, oom=True, planned=2500.0, peak=None, batch=1024)
    no_numbers = _row(3, oom=True, planned=None, peak=None)
    no_batch = _row(4, oom=False, planned=900.0, peak=950.0, batch=None)
    assert point_mb(fine) == 1800.0
    assert point_mb(oom_with_peak) == 3000.0  # what it asked for, not what it reached
    assert point_mb(oom_without_peak) == 2500.0
    rows = [fine, oom_with_peak, oom_without_peak, no_numbers, no_batch]
    assert [r.trial for r in vram_points(_detail(vram=rows))] == [0, 1, 2]

    chart = vram_chart(_detail(vram=rows))
    oom_trace = next(t for t in chart.figure.data if "OOM (at planned MB)" in t.name)
    assert list(oom_trace.y) == [3000.0, 2500.0]


def test_one_completed_trial_is_singular_in_the_importance_note():
    from orchestrator.show.importance import importance_note

    assert importance_note(1) == "skipped: 1 completed trial, importances need at least 8"
    assert importance_note(3).startswith("skipped: 3 completed trials,")


def test_the_vram_chart_hover_says_trials_at_once_in_words():
    from test_status import _detail

    from orchestrator.show.report.charts import vram_chart

    rows = [_row(0, oom=False, planned=1000.0, peak=1800.0)]
    rows.append(dataclasses.replace(rows[0], trial=1, concurrency=1))
    rows.append(dataclasses.replace(rows[0], trial=2, concurrency=None))
    (trace,) = [t for t in vram_chart(_detail(vram=rows)).figure.data if t.mode == "markers"]
    assert list(trace.text) == [
        "trial #0, 2 trials at once",
        "trial #1, 1 trial at once",
        "trial #2",
    ]
