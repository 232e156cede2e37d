"""Live progress: log lines off a terminal, a rich panel on one, nothing with --quiet."""

from __future__ import annotations

import io

import pytest

from orchestrator.record.store.location import StorageLocation
from orchestrator.run.pool.progress import (
    LiveProgress,
    LogProgress,
    QuietProgress,
    format_duration,
    make_progress,
    render,
    summary_line,
)
from orchestrator.run.pool.snapshot import GpuSnapshot, PoolSnapshot


def snapshot(
    counted: int = 3, *, elapsed: float = 60.0, best: float | None = 0.25, ooms: int = 1
) -> PoolSnapshot:
    gpus = (
        GpuSnapshot("cuda:0 NVIDIA L4", 2, 4, 2, 9.5 * 1024, 22.5 * 1024, ooms, (64, 1536)),
        GpuSnapshot("sim:1 Simulated GPU 24 GB", 4, 4, 3, None, None, 0, (64, 4096)),
    )
    return PoolSnapshot(
        study_name="dqn",
        budget=10,
        counted=counted,
        running=5,
        waiting=1,
        best_value=best,
        best_trial=7 if best is not None else None,
        direction="maximize",
        metric="return",
        elapsed_s=elapsed,
        gpus=gpus,
        ooms=ooms,
        retries=2,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "?"), (0, "0s"), (9.4, "9s"), (133, "2m13s"), (3725, "1h02m"), (-3, "0s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_summary_line_says_everything_a_person_watches_for():
    line = summary_line(snapshot())
    for words in (
        "[dqn]",
        "3/10 trials",
        "5 running",
        "1 waiting",
        "best return 0.25 (#7)",
        "cuda:0 2 running, 2 slots, 9.5/22.5 GB",
        "sim:1 3 running, 4 slots",
        "1 OOM",
        "2 retries",
        "1m00s elapsed",
        "~2m20s left",
    ):
        assert words in line
    assert "best return -" in summary_line(snapshot(0, best=None))
    assert "left" not in summary_line(snapshot(0))  # no rate yet, no estimate


def test_log_lines_on_each_finished_trial_and_at_most_every_ten_seconds():
    out = io.StringIO()
    clock = Clock()
    progress = LogProgress(stream=out, clock=clock)
    progress.update(snapshot(3))  # first call: a line
    for t in (1, 2, 5, 9.9):  # same count, inside the interval: quiet
        clock.now = t
        progress.update(snapshot(3))
    assert out.getvalue().count("\n") == 1
    clock.now = 10.5
    progress.update(snapshot(3))  # interval passed: a line
    clock.now = 11
    progress.update(snapshot(4))  # a trial finished: a line at once
    clock.now = 12
    progress.update(snapshot(4))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "3/10 trials" in lines[1] and "4/10 trials" in lines[2]
    progress.close(snapshot(10))
    assert "done: 10/10 trials" in out.getvalue().splitlines()[-1]


def test_verbose_log_adds_a_line_per_gpu():
    out = io.StringIO()
    progress = make_progress(quiet=False, verbose=True, stream=out)
    assert isinstance(progress, LogProgress)
    progress.update(snapshot())
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert (
        "cuda:0 NVIDIA L4: 2 running, 2 slots (plan allows 4), 9.5/22.5 GB, 1 OOM, batch 64-1536"
        in lines[1]
    )


def test_quiet_prints_nothing():
    out = io.StringIO()
    progress = make_progress(quiet=True, verbose=False, stream=out)
    assert isinstance(progress, QuietProgress)
    progress.update(snapshot())
    progress.close(snapshot(10))
    assert out.getvalue() == ""


def test_a_terminal_gets_the_live_panel():
    out = io.StringIO()
    progress = make_progress(quiet=False, verbose=False, stream=out, force_terminal=True)
    assert isinstance(progress, LiveProgress)
    progress.update(snapshot(3))
    progress.update(snapshot(4, elapsed=80))
    progress.close(snapshot(10, elapsed=200))
    text = out.getvalue()
    assert "\x1b[" in text  # drawn with terminal control codes
    assert "4/10" in text and "10/10" in text
    assert "done: 10/10 trials in 3m20s" in text


def test_the_panel_shows_slots_and_vram_per_gpu():
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, force_terminal=False, width=80).print(render(snapshot()))  # a plain terminal
    text = out.getvalue()
    for words in (
        "dqn",
        "3/10",
        "best return 0.25 (#7)",
        "cuda:0 NVIDIA L4",
        "2/4",
        "9.5/22.5 GB",
        "sim:1 Simulated GPU 24 GB",
        "4/4",
        "64-4096",
        "~2m20s left",
        "2 retries",
    ):
        assert words in text


def test_a_pipe_is_not_a_terminal():
    assert isinstance(make_progress(quiet=False, verbose=False, stream=io.StringIO()), LogProgress)


def test_log_records_print_above_the_live_panel_and_the_handler_is_restored():
    import logging

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        progress = make_progress(quiet=False, verbose=False, stream=out, force_terminal=True)
        progress.update(snapshot(3))
        assert handler.stream is not out  # routed through the panel's console
        logging.getLogger("orchestrator.run.pool.loop").warning("slots 6 -> 3 (oom)")
        progress.update(snapshot(4))
        progress.close(snapshot(10))
        assert handler.stream is out
    finally:
        root.removeHandler(handler)
    assert "slots 6 -> 3 (oom)" in out.getvalue()


def test_no_x_slash_y_slots_that_could_be_read_two_ways():
    """Log lines, the verbose line and the panel each say what their slot numbers are."""
    import re

    from rich.console import Console

    from orchestrator.run.pool.progress import gpu_line

    snap = snapshot()
    texts = [summary_line(snap), *(gpu_line(gpu) for gpu in snap.gpus)]
    for text in texts:
        assert not re.search(r"\d+/\d+ slots", text), text
    out = io.StringIO()
    Console(file=out, force_terminal=False, width=80).print(render(snap))
    header = next(line for line in out.getvalue().splitlines() if line.startswith("GPU"))
    assert "slots/max" in header.split()


def test_a_budget_of_one_trial_is_singular():
    from dataclasses import replace

    from orchestrator.run.pool.progress import final_line

    one = replace(snapshot(0), budget=1)
    assert "0/1 trial ·" in summary_line(one)
    assert "done: 1/1 trial in" in final_line(replace(one, counted=1))
    assert "3/10 trials" in summary_line(snapshot())


def test_a_study_of_several_objectives_shows_the_size_of_its_front_not_a_best():
    import dataclasses

    several = dataclasses.replace(snapshot(best=None), front=3)
    assert "front 3 trials" in summary_line(several)
    assert "best return" not in summary_line(several)
    assert "front 1 trial " in summary_line(dataclasses.replace(several, front=1)) + " "
    assert "best return 0.25 (#7)" in summary_line(snapshot())  # one objective: as before


def test_the_stored_front_is_worked_out_again_only_when_the_count_changes(tmp_path):
    import optuna
    from sqlalchemy import create_engine

    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.pool.stored_study import StoredStudy

    url = f"sqlite:///{tmp_path / 'front.db'}"
    study = optuna.create_study(storage=url, directions=["maximize", "minimize"])
    for values in ([1.0, 5.0], [2.0, 6.0], [0.5, 7.0]):  # the third is dominated by the first
        study.add_trial(optuna.trial.create_trial(values=values))
    spec = StudySpec(
        adapter="dqn",
        trials=10,
        epochs=1,
        direction="maximize",
        directions=["maximize", "minimize"],
    )
    stored = StoredStudy(
        storage_location=StorageLocation.parse(url),
        engine=create_engine(url),
        study=study,
        spec=spec,
    )
    assert stored.front_size(3) == 2
    study.add_trial(optuna.trial.create_trial(values=[3.0, 1.0]))  # dominates all three
    assert stored.front_size(3) == 2  # the count has not moved: not read again
    assert stored.front_size(4) == 1
    one = StoredStudy(
        storage_location=StorageLocation.parse(url),
        engine=create_engine(url),
        study=study,
        spec=StudySpec(adapter="dqn", trials=10, epochs=1, direction="maximize"),
    )
    assert one.front_size(4) is None
