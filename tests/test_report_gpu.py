"""The report says what ran and how the GPUs were used: sampler, pruner, seed and times; the best
trial under its metric's name with its parameters as YAML; Optuna's slice and contour; a timeline
of each GPU's trials and the memory they held; trials.csv's times and log links; the Pareto front
of several objectives; why a CPU-only study has no VRAM. On a real `run` on simulated GPUs,
through the real CLI, and its charts drawn in headless Chromium."""

from __future__ import annotations

import csv
import datetime as dt
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from test_report import REPO, assert_offline_page, assert_png
from test_status import run_cli

import orchestrator
from orchestrator.record.store.location import StorageLocation
from orchestrator.show.report.gpu_timeline import (
    CPU_ONLY_NOTE,
    Bar,
    Lane,
    allowance,
    memory_held,
    pack_rows,
    trial_lanes,
)
from orchestrator.show.run_facts import objective_names, run_facts, wall_text

DOCS_SCREENS = REPO / "docs" / "screens"
T0 = dt.datetime(2026, 12, 1, 12, 0, 0)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# --- a real study, run once for the module ------------------------------------------------------


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    """`run synthetic` for 6 trials on two simulated GPUs, then `report --out`: what both left."""
    where = tmp_path_factory.mktemp("ran")
    url = f"sqlite:///{where / 'study.db'}"
    env = dict(os.environ, PYTHONPATH=str(REPO), ORCHESTRATOR_STORAGE=url)

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            cwd=where, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    done = cli("run", "synthetic", "--trials", "6", "--gpus", "sim:12288,sim:24576",
               "--option", "trial_seconds=0.2", "--quiet")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = cli("report", "--out", "report")
    assert report.returncode == 0, report.stderr[-3000:]
    study = optuna.load_study(study_name="synthetic", storage=url)
    out = where / "report"
    with (out / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {"study": study, "out": out, "page": assert_offline_page(out / "index.html"),
            "rows": rows, "printed": report.stdout, "cli": cli}  # fmt: skip


def test_status_and_best_read_back_what_the_run_wrote(ran):
    """End to end: `run` on simulated GPUs writes what status, best and report read back."""
    status = ran["cli"]("status", "--study", "synthetic", "--json")
    assert status.returncode == 0, status.stderr
    detail = json.loads(status.stdout)
    assert detail["counted"] == 6 and detail["budget"] == 6
    assert len(detail["vram"]) == 6 and all(row["vram_peak_mb"] > 0 for row in detail["vram"])
    assert {row["gpu"] for row in detail["vram"]} <= {w["gpu_name"] for w in detail["workers"]}
    assert detail["concurrency_events"], "the pool records at least its start"
    best = ran["cli"]("best", "--study", "synthetic")
    assert json.loads(best.stdout)["params"] == detail["best"]["params"]
    assert_png(ran["out"] / "vram.png")


def test_the_report_says_what_ran_and_when(ran):
    page, study = ran["page"], ran["study"]
    spec = study.user_attrs["orchestrator"]
    what_ran = _table_after(page, "What ran")
    assert what_ran["sampler"] == spec["sampler"] == "pso"
    assert what_ran["pruner"] == spec["pruner"] == "median"
    assert what_ran["seed"] == str(spec["seed"])
    starts = [t.datetime_start for t in study.trials]
    ends = [t.datetime_complete for t in study.trials]
    first = min(starts).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    last = max(ends).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert what_ran["start (UTC)"] == first and what_ran["end (UTC)"] == last
    assert what_ran["wall time"] == wall_text((max(ends) - min(starts)).total_seconds())


def test_the_best_trial_is_named_by_its_metric_with_parameters_as_yaml(ran):
    page, study = ran["page"], ran["study"]
    best = orchestrator.recommend(study)  # the trial to deploy, not the luckiest run
    # Six configurations are too few for a model: the figure is what was observed.
    assert f"<h2>Recommended trial #{best.number}: loss observed " in page
    block = re.search(r"<pre class='yaml' id='best-params'>(.*?)</pre>", page, re.S)
    assert block is not None
    assert yaml.safe_load(html.unescape(block.group(1))) == best.params
    assert list(yaml.safe_load(html.unescape(block.group(1)))) == list(best.params)  # drawn order


def test_slice_contour_and_the_gpu_charts_are_drawn(ran):
    page, out = ran["page"], ran["out"]
    for title in ("Slice", "Contour", "Trials on each GPU over time", "GPU memory held over time"):
        assert f"<h2>{title}</h2>" in page
    for name in ("slice", "timeline", "memory"):
        assert_png(out / f"{name}.png")
        assert str(Path("report") / f"{name}.png") in ran["printed"]
    assert "pair by pair (on this page only, no PNG" in page  # the contour's PNG costs too much
    figures = _figures(page)
    slice_ = next(f for f in figures if f["layout"]["title"]["text"] == "Slice Plot")
    assert "width" not in slice_["layout"]  # it takes the page's width (Optuna's: 300 px a panel)
    axes = [v for k, v in slice_["layout"].items() if k.startswith("xaxis")]
    assert len(axes) >= 5 and all(axis["nticks"] == 4 for axis in axes)
    assert any(axis.get("type") == "log" and axis["tickformat"] == "~s" for axis in axes)
    timeline = next(f for f in figures if f["layout"]["title"]["text"].startswith("Trials on each"))
    bars = {int(t[1:]) for trace in timeline["data"] for t in trace["text"]}
    assert bars == {t.number for t in ran["study"].trials}  # every trial, once, as a bar
    labels = {y.split(" · ")[0] for trace in timeline["data"] for y in trace["y"]}
    ran_on = {f"vm #{t.user_attrs['gpu_index']} {t.user_attrs['gpu']}" for t in ran["study"].trials}
    assert labels == ran_on  # each on the GPU it ran on
    memory = next(f for f in figures if f["layout"]["title"]["text"] == "GPU memory held over time")
    held = [t for t in memory["data"] if t["name"].endswith("held by trials")]
    peaks = [t.user_attrs["vram_peak_mb"] for t in ran["study"].trials]
    assert held and max(max(t["y"]) for t in held) <= sum(peaks) + 0.5
    assert max(max(t["y"]) for t in held) >= max(peaks) - 0.5
    may_use = [t for t in memory["data"] if t["name"].endswith("trials may use")]
    assert may_use and all(max(t["y"]) > 0 for t in may_use)


def test_trials_csv_has_times_and_the_page_links_each_log(ran):
    rows, page = ran["rows"], ran["page"]
    header = list(rows[0])
    assert header[:7] == ["trial", "state", "loss", "epochs", "seconds", "start", "complete"]
    for row in rows:
        start = dt.datetime.strptime(row["start"], "%Y-%m-%d %H:%M:%S")
        complete = dt.datetime.strptime(row["complete"], "%Y-%m-%d %H:%M:%S")
        assert start <= complete
        log = Path(row["log_file"])
        assert log.is_absolute() and log.exists()
        assert f"href='{log.as_uri()}'" in page


# --- several objectives, and a CPU-only study (built here, reported by the real CLI) -------------


def test_several_objectives_show_their_pareto_front(sqlite_url, tmp_path, capsys):
    from orchestrator.record.store.migrate import open_storage

    study = optuna.create_study(
        study_name="two",
        storage=open_storage(StorageLocation.parse(sqlite_url)),
        directions=["minimize", "maximize"],
    )
    study.set_metric_names(["loss", "sharpe"])
    dist = {"x": FloatDistribution(0, 1)}
    points = [(0.1, 1.0), (0.2, 2.0), (0.3, 1.5), (0.05, 0.2), (0.4, 2.0)]  # #2, #4 dominated
    for x, (loss, sharpe) in enumerate(points):
        study.add_trial(
            create_trial(values=[loss, sharpe], params={"x": x / 10}, distributions=dist)
        )
    out = tmp_path / "r"
    code, printed, err = run_cli(capsys, "report", "--storage", sqlite_url, "--out", str(out))
    assert code == 0, err
    page = (out / "index.html").read_text()
    assert "<h2>Pareto front: 3 trials (loss / sharpe)</h2>" in page
    front = re.search(r"<table class='pareto'>(.*?)</table>", page, re.S).group(1)
    assert re.findall(r"<td>#(\d+)</td>", front) == ["0", "1", "3"]
    assert [t.number for t in study.best_trials] == [0, 1, 3]
    assert_png(out / "pareto.png")
    assert "Best trial" not in page
    with (out / "trials.csv").open() as f:
        assert list(csv.DictReader(f))[0]["sharpe"] == "1.0"


def test_a_cpu_only_study_says_why_it_has_no_vram(sqlite_url, tmp_path, capsys):
    from orchestrator.record.store.migrate import open_storage

    study = optuna.create_study(
        study_name="cpu", storage=open_storage(StorageLocation.parse(sqlite_url))
    )
    dist = {"x": FloatDistribution(0, 1)}
    for n in range(3):
        attrs = {"gpu": "cpu", "host": "vm", "gpu_index": None, "concurrency": 1}
        study.add_trial(create_trial(value=n, params={"x": n / 4}, distributions=dist,
                                     user_attrs=attrs))  # fmt: skip
    out = tmp_path / "r"
    code, printed, _ = run_cli(capsys, "report", "--storage", sqlite_url, "--out", str(out))
    assert code == 0
    page = html.unescape((out / "index.html").read_text())
    assert page.count(CPU_ONLY_NOTE) == 3  # VRAM by GPU, memory over time, batch size vs VRAM
    assert "no trial has recorded its VRAM yet" not in page
    assert_png(out / "timeline.png")  # the CPU's trials still have a timeline
    assert not (out / "memory.png").exists()


# --- the decisions, on plain values ------------------------------------------------------------


def test_trials_that_overlap_get_rows_of_their_own():
    bars = [Bar(0, "COMPLETE", at(0), at(10), 100, 64), Bar(1, "COMPLETE", at(2), at(4), 50, 64),
            Bar(2, "PRUNED", at(5), at(12), 70, 64), Bar(3, "COMPLETE", at(10), at(11), 10, 64)]  # fmt: skip
    rows = {b.trial: b.row for b in pack_rows(bars)}
    assert rows == {0: 0, 1: 1, 2: 1, 3: 0}  # never more rows than trials at once


def test_memory_held_adds_up_the_running_trials():
    bars = [Bar(0, "COMPLETE", at(0), at(10), 100, 64), Bar(1, "COMPLETE", at(2), at(4), 50, 64),
            Bar(2, "FAIL", at(4), at(6), None, 64)]  # fmt: skip
    held = memory_held(bars)
    assert held.times == [at(0), at(2), at(4), at(10)]
    assert held.values == [100, 150, 100, 0]


def test_the_allowance_steps_with_the_pools_changes_and_ends_with_the_study():
    from orchestrator.record.store.records import ConcurrencyEvent

    def change(s: float, to_mb: float | None, index: int = 0) -> ConcurrencyEvent:
        return ConcurrencyEvent(at=at(s), host="vm", gpu_index=index, gpu_name="L4",
                                from_slots=0, to_slots=1, reason="x", detail=None, to_mb=to_mb)  # fmt: skip

    lane = Lane("vm #0 L4", "vm", 0, "L4", [])
    events = [change(0, 5000), change(30, 10000), change(40, 9000, index=1), change(50, None)]
    steps = allowance(events, lane, until=at(60))
    assert steps.times == [at(0), at(30), at(60)] and steps.values == [5000, 10000, 10000]
    assert allowance([change(0, None)], lane, until=at(60)) is None


def test_a_running_trial_ends_at_the_reports_moment_and_lanes_are_per_gpu():
    dist = {"x": FloatDistribution(0, 1)}
    local = T0.replace(tzinfo=dt.UTC).astimezone().replace(tzinfo=None)  # Optuna's local time

    def trial(n: int, index: int, state: TrialState) -> optuna.trial.FrozenTrial:
        made = create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None,
                            params={"x": 0.5}, distributions=dist,
                            user_attrs={"gpu": "L4", "gpu_index": index, "host": "vm",
                                        "vram_peak_mb": 100.0})  # fmt: skip
        made.datetime_start = local + dt.timedelta(seconds=n)
        made.datetime_complete = (
            None if state == TrialState.RUNNING else local + dt.timedelta(seconds=n + 5)
        )
        return made

    trials = [trial(0, 1, TrialState.COMPLETE), trial(1, 0, TrialState.RUNNING)]
    lanes = trial_lanes(trials, until=at(100))
    assert [lane.label for lane in lanes] == ["vm #0 L4", "vm #1 L4"]
    assert lanes[0].bars[0].end == at(100) and lanes[1].bars[0].end == at(5)


def test_a_trial_holds_its_gpu_from_its_admission_not_its_ask():
    """A trial is stamped by Optuna when asked, then waits for room on its GPU: its bar and its
    memory start when the GPU admitted it (a trial recorded before admission times: its ask)."""
    dist = {"x": FloatDistribution(0, 1)}
    local = T0.replace(tzinfo=dt.UTC).astimezone().replace(tzinfo=None)  # Optuna's local time

    def trial(admitted: str | None) -> optuna.trial.FrozenTrial:
        attrs = {"gpu": "L4", "gpu_index": 0, "host": "vm", "vram_peak_mb": 100.0}
        if admitted is not None:
            attrs["admitted_at"] = admitted
        made = create_trial(state=TrialState.COMPLETE, value=1.0, params={"x": 0.5},
                            distributions=dist, user_attrs=attrs)  # fmt: skip
        made.datetime_start, made.datetime_complete = local, local + dt.timedelta(seconds=10)
        return made

    waited = trial((T0 + dt.timedelta(seconds=4)).replace(tzinfo=dt.UTC).isoformat())
    (lane,) = trial_lanes([waited, trial(None), trial("not a time")], until=at(100))
    assert [bar.start for bar in lane.bars] == [at(0), at(0), at(4)]
    held = memory_held(lane.bars)
    assert held.values[held.times.index(at(4))] == 300.0


def test_run_facts_of_a_study_made_by_plain_optuna_say_not_recorded():
    facts = run_facts(None, [])
    assert (facts.sampler, facts.pruner, facts.seed) == ("not recorded",) * 3
    assert facts.wall_seconds is None and wall_text(None) == "-"
    assert [wall_text(s) for s in (12.44, 185, 3720)] == ["12.4 s", "3 min 05 s", "1 h 02 min"]


def test_objectives_are_named_by_the_study_then_the_adapter():
    assert objective_names(["sharpe"], 1, "value") == ["sharpe"]
    assert objective_names(None, 1, "loss") == ["loss"]
    assert objective_names(None, 2, "loss") == ["objective 0", "objective 1"]
    assert objective_names(["a", "b"], 2, "loss") == ["a", "b"]


# --- helpers -----------------------------------------------------------------------------------


def _table_after(page: str, heading: str) -> dict[str, str]:
    table = re.search(rf"<h2>{heading}</h2><table[^>]*>(.*?)</table>", page, re.S).group(1)
    return {html.unescape(k): html.unescape(v)
            for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table)}  # fmt: skip


def _figures(page: str) -> list[dict]:
    """Each plotly figure of the page, as the JSON that Plotly.newPlot draws."""
    figures = []
    for call in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', page):
        decoder = json.JSONDecoder()
        data, end = decoder.raw_decode(page, call.end())
        rest = page[end:].lstrip().lstrip(",").lstrip()
        layout, _ = decoder.raw_decode(rest)
        figures.append({"data": data, "layout": layout})
    return figures


# --- in headless Chromium ----------------------------------------------------------------------

FIGURE = (
    "[...document.querySelectorAll('.plotly-graph-div')].find(d => d.layout.title.text === {!r})"
)


@pytest.mark.browser
def test_the_new_charts_render_in_chromium(ran, tmp_path):
    from cdp import Browser
    from test_dashboard_browser import ARTIFACTS, require_chromium

    chromium = require_chromium()
    timeline = FIGURE.format("Trials on each GPU over time")
    memory = FIGURE.format("GPU memory held over time")
    with Browser(chromium, tmp_path / "profile", size=(1200, 900)) as browser:
        browser.open(f"file://{ran['out'] / 'index.html'}")
        browser.wait_for_text("Trials on each GPU over time", timeout_s=120)  # 5 MB, 2 busy cores
        assert browser.on_first_screen("What ran")
        bars = browser.evaluate(f"{timeline}.querySelectorAll('.bars .point path').length")
        filled = browser.evaluate(f"{memory}.querySelectorAll('.scatterlayer path.js-fill').length")
        drawn = browser.evaluate(
            "[...document.querySelectorAll('.plotly-graph-div')].map(d => d.layout.title.text)"
        )
        for name, element in (("timeline", timeline), ("memory", memory)):
            browser.screenshot_of(element, ARTIFACTS / f"report-{name}.png")
        browser.screenshot_of("document.querySelector('section.summary')",
                              ARTIFACTS / "report-summary.png")  # fmt: skip
    assert bars == len(ran["study"].trials)  # one bar a trial, drawn as SVG
    assert filled >= 1  # the memory held, one filled area a GPU that ran trials
    assert {"Slice Plot", "Contour Plot"} <= set(drawn)
    for name in ("timeline", "memory", "summary"):
        assert_png(ARTIFACTS / f"report-{name}.png")


def screenshots(page: Path, out: Path, chromium: str) -> list[Path]:
    """PNGs of the report's summary and new charts, as docs/see-a-study.md shows them."""
    import tempfile

    from cdp import Browser

    shots = {
        "report-summary.png": "document.querySelector('section.summary')",
        "report-timeline.png": FIGURE.format("Trials on each GPU over time"),
        "report-memory.png": FIGURE.format("GPU memory held over time"),
        "report-slice.png": FIGURE.format("Slice Plot"),
        "report-contour.png": FIGURE.format("Contour Plot"),
    }
    with (
        tempfile.TemporaryDirectory() as profile,
        Browser(chromium, Path(profile), size=(1200, 900)) as browser,
    ):
        browser.open(page.resolve().as_uri())
        browser.wait_for_text("Trials on each GPU over time", timeout_s=120)
        for name, element in shots.items():
            browser.screenshot_of(element, out / name)
    return [out / name for name in shots]


if __name__ == "__main__":
    # python tests/test_report_gpu.py report/index.html docs/screens
    from test_dashboard_browser import find_chromium

    found = find_chromium()
    if found is None or len(sys.argv) != 3:
        sys.exit(
            "usage: python tests/test_report_gpu.py REPORT/index.html OUT_DIR (needs chromium)"
        )
    for shot in screenshots(Path(sys.argv[1]), Path(sys.argv[2]), found):
        print(shot)
