"""The report's newer parts: axes named by the metric, learning curves with the pruned trials
marked, the sortable trial table (sorted in Chromium) and trials.csv, parallel coordinates of the
most important parameters for 10+ of them, and memory-model lines that coincide still visible."""

from __future__ import annotations

import csv
import math
import random

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from test_report import assert_png
from test_status import _detail, build_study
from test_status import run_cli as run_in_process

from orchestrator.record.store.location import StorageLocation
from orchestrator.show.report.chart_data import line_styles
from orchestrator.show.report.charts import curves_chart, plotly_charts, vram_chart
from orchestrator.show.report.parallel import MAX_AXES, axes_for, explained_share, rank_parameters
from orchestrator.show.views import MemoryLine, VramRow


def curves_study(url: str) -> optuna.Study:
    """Two complete trials and two pruned ones, each with its value per epoch, made by `run`'s spec."""
    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.study.spec import StudySpec, save_spec

    study = optuna.create_study(
        study_name="curves", storage=open_storage(StorageLocation.parse(url))
    )
    save_spec(study, StudySpec(adapter="synthetic", trials=4, epochs=4, direction="minimize"))
    dist = {"x": FloatDistribution(-5, 5)}
    for n, (state, steps) in enumerate(
        [
            (TrialState.COMPLETE, 4),
            (TrialState.PRUNED, 2),
            (TrialState.COMPLETE, 4),
            (TrialState.PRUNED, 1),
        ]
    ):
        curve = {e: 10.0 - e + n for e in range(steps)}
        value = curve[steps - 1] if state == TrialState.COMPLETE else None
        study.add_trial(
            create_trial(state=state, value=value, params={"x": float(n)}, distributions=dist,
                         intermediate_values=curve)
        )  # fmt: skip
    return study


def test_the_charts_axes_are_named_by_the_metric_and_curves_mark_the_pruned(
    sqlite_url, tmp_path, capsys
):
    study = curves_study(sqlite_url)
    chart = curves_chart(study, "loss")
    figure = chart.figure
    assert figure.layout.yaxis.title.text == "loss" and figure.layout.xaxis.title.text == "epoch"
    pruned = next(t for t in figure.data if t.name.startswith("pruned ("))
    assert [x for x in pruned.x if x is not None] == [0, 1, 0]  # trials 1 and 3, epoch by epoch
    ends = next(t for t in figure.data if t.name == "pruned here")
    assert list(zip(ends.x, ends.y, strict=True)) == [(1, 10.0), (0, 13.0)]  # where each stopped
    best = next(t for t in figure.data if t.name.startswith("best trial"))
    assert best.name == "best trial #0" and list(best.y) == [10.0, 9.0, 8.0, 7.0]
    assert chart.note == "loss per epoch of every trial; 2 pruned"

    out = tmp_path / "r"
    code, printed, _ = run_in_process(capsys, "report", "--storage", sqlite_url, "--out", str(out))
    assert code == 0 and str(out / "curves.png") in printed
    assert_png(out / "curves.png")
    page = (out / "index.html").read_text()
    assert "Objective Value" not in page
    history = next(c for c in plotly_charts(study, _detail(), "loss") if c.key == "history")
    assert history.figure.layout.yaxis.title.text == "loss"


def test_every_trial_is_in_trials_csv_and_the_page_table(sqlite_url, tmp_path, capsys):
    built = build_study(sqlite_url, completed=5)
    out = tmp_path / "r"
    code, printed, _ = run_in_process(capsys, "report", "--storage", sqlite_url, "--out", str(out))
    assert code == 0 and str(out / "trials.csv") in printed
    with (out / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    study = optuna.load_study(study_name="demo", storage=sqlite_url)
    assert [int(r["trial"]) for r in rows] == [t.number for t in study.trials]
    best = next(r for r in rows if int(r["trial"]) == built["best"])
    assert float(best["loss"]) == pytest.approx(built["values"][built["best"]])
    assert best["gpu"] and float(best["vram_peak_mb"]) > 0 and best["concurrency"]
    assert list(rows[0])[:5] == ["trial", "state", "loss", "epochs", "seconds"]
    assert {"x", "y", "learning_rate", "batch_size", "activation"} <= set(rows[0])
    page = (out / "index.html").read_text()
    assert "<table class='sortable trials'>" in page and "trials.csv" in page


@pytest.mark.browser
def test_the_trial_table_sorts_by_a_clicked_column_in_chromium(sqlite_url, tmp_path, capsys):
    from cdp import Browser
    from test_dashboard_browser import require_chromium

    chromium = require_chromium()
    built = build_study(sqlite_url, completed=6)
    out = tmp_path / "r"
    assert run_in_process(capsys, "report", "--storage", sqlite_url, "--out", str(out))[0] == 0
    column = "Array.from(document.querySelectorAll('table.trials tbody tr')).map(r => r.cells[2].getAttribute('data-v'))"
    click = "Array.from(document.querySelectorAll('table.trials th')).find(h => h.textContent === 'loss').click()"
    with Browser(chromium, tmp_path / "profile") as browser:
        browser.open(f"file://{out / 'index.html'}")
        browser.wait_for_text("click a column to sort by it", timeout_s=120)  # a 5 MB page
        browser.evaluate(click)
        ascending = browser.evaluate(column)
        browser.evaluate(click)
        descending = browser.evaluate(column)
    values = [float(v) for v in ascending if v]
    assert values == sorted(values) and float(ascending[0]) == pytest.approx(
        min(built["values"].values())
    )
    assert [float(v) for v in descending if v] == sorted(values, reverse=True)
    assert ascending[-1] == "" and descending[-1] == ""  # trials without a value stay last


def wide_study(n_trials: int) -> optuna.Study:
    """12 parameters (9 floats, a log float, a log int, a choice); the value depends on two."""
    rng = random.Random(0)
    dists = {f"p{i:02d}": FloatDistribution(0, 1) for i in range(9)}
    dists["learning_rate"] = FloatDistribution(1e-5, 1e-1, log=True)
    dists["batch_size"] = IntDistribution(64, 4096, log=True)
    dists["act"] = CategoricalDistribution(("gelu", "relu", "tanh"))
    study = optuna.create_study()
    for _ in range(n_trials):
        params = {f"p{i:02d}": rng.random() for i in range(9)}
        params["learning_rate"] = 10 ** rng.uniform(-5, -1)
        params["batch_size"] = int(2 ** rng.uniform(6, 12))
        params["act"] = rng.choice(dists["act"].choices)
        value = 10 * (params["p03"] - 0.5) ** 2 + 3 * abs(math.log10(params["learning_rate"]) + 3)
        study.add_trial(
            create_trial(params=params, distributions=dists, value=value + 0.01 * rng.random())
        )
    return study


@pytest.mark.parametrize(
    ("n_trials", "method"), [(150, "PED-ANOVA"), (6, "share of the value's spread")]
)
def test_parallel_coordinates_show_the_most_important_parameters_first(n_trials, method):
    study = wide_study(n_trials)
    ranking = rank_parameters(study, study.trials, min_for_importance=8)
    assert ranking.method == method and len(ranking.names) == 12
    if n_trials > 100:  # enough trials to know: the two that matter lead
        assert set(ranking.names[:2]) == {"learning_rate", "p03"}
    assert (
        ranking.note()
        == f"the {MAX_AXES} most important of 12 parameters ({method}), most important first"
    )
    axes = axes_for(study.trials, ranking.shown(), "loss")
    assert [a.label for a in axes] == ["loss", *ranking.names[:MAX_AXES]]
    kinds = {a.label: a.kind for a in axes}
    if "learning_rate" in kinds:
        assert kinds["learning_rate"] == "log"


def test_the_cheap_proxy_finds_an_optimum_in_the_middle_of_a_range():
    study = wide_study(60)
    shares = {name: explained_share(study.trials, name) for name in ("p03", "learning_rate", "p00")}
    # value is lowest in the middle of p03 and of log10(learning_rate): no trend, still found
    assert shares["learning_rate"] > 0.5 and shares["p03"] > shares["p00"]


def test_memory_model_lines_that_coincide_are_all_visible():
    rows = [
        VramRow(0, "COMPLETE", "NVIDIA L4", 0, "h", 256, 600.0, 610.0, 2, False),
        VramRow(1, "COMPLETE", "NVIDIA L40S", 1, "h", 512, 700.0, 690.0, 2, False),
    ]
    same = [
        MemoryLine("NVIDIA L4", 500.0, 0.2, "plan"),
        MemoryLine("NVIDIA L40S", 500.0, 0.2, "plan"),
    ]
    styles = line_styles(same, base=2.0)
    assert styles[("NVIDIA L4", "plan")] == (5.0, "")
    assert styles[("NVIDIA L40S", "plan")] == (2.0, ", on the same line as NVIDIA L4")

    figure = vram_chart(_detail(vram=rows, memory_lines=same)).figure
    lines = [t for t in figure.data if t.mode == "lines"]
    assert [t.name for t in lines] == [
        "NVIDIA L4 memory model (plan)",
        "NVIDIA L40S memory model (plan), on the same line as NVIDIA L4",
    ]
    # the wide one is drawn first, the thin one on top of it, in another colour: both show
    assert lines[0].line.width > lines[1].line.width and lines[0].line.color != lines[1].line.color

    apart = [
        MemoryLine("NVIDIA L4", 500.0, 0.2, "plan"),
        MemoryLine("NVIDIA L40S", 800.0, 0.2, "plan"),
    ]
    assert {w for w, _ in line_styles(apart, base=2.0).values()} == {2.0}
