"""`status` and the read-only views behind it, on SQLite and PostgreSQL.

`build_study` writes a study the way workers do (trials with VRAM user attributes on two kinds of
GPU, an OOM whose parameters were re-queued, orch_* rows); test_best and test_report use it too.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from adapters.synthetic import synthetic_value
from orchestrator.cli import main
from orchestrator.record.store.location import StorageLocation

BUDGET = 12
GPUS = (("node-a", 0, "NVIDIA L4", 500.0, 0.02), ("node-b", 1, "NVIDIA L40S", 800.0, 0.05))


def trial_params(i: int) -> dict:
    return {
        "x": -4.0 + 0.7 * (i % 12),
        "y": 3.0 - 0.5 * (i % 12),
        "learning_rate": 10 ** (-5 + 0.3 * (i % 12)),
        "batch_size": 64 * (1 + (i * 7) % 20),
        "activation": ("gelu", "relu", "tanh")[i % 3],
    }


def distributions() -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    return {
        "x": FloatDistribution(-5, 5),
        "y": FloatDistribution(-5, 5),
        "learning_rate": FloatDistribution(1e-5, 1e-1, log=True),
        "batch_size": IntDistribution(64, 4096, log=True),
        "activation": CategoricalDistribution(("gelu", "relu", "tanh")),
    }


def vram_attrs(i: int, params: dict, *, oom: bool = False) -> dict:
    host, index, gpu, overhead, per_sample = GPUS[i % 2]
    planned = overhead + params["batch_size"] * per_sample
    return {
        "vram_peak_mb": round(planned * (1.0 + 0.01 * i), 1),
        "vram_planned_mb": planned,
        "gpu": gpu,
        "gpu_index": index,
        "host": host,
        "concurrency": 4 if i < 5 else 2,
        "batch_bounds": [64, 4096],
        "oom": oom,
    }


def build_study(url: str, name: str = "demo", *, completed: int = 10) -> dict:
    """A study with `completed` finished trials, one OOM (re-queued), one running; returns what went in."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from orchestrator.record.store import records
    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.study.spec import StudySpec, save_spec

    storage = open_storage(StorageLocation.parse(url))
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize")
    save_spec(study, StudySpec(adapter="synthetic", trials=BUDGET, epochs=3, direction="minimize"))
    values = {}
    for i in range(completed):
        params = trial_params(i)
        values[i] = synthetic_value(params)
        study.add_trial(
            create_trial(
                params=params,
                distributions=distributions(),
                value=values[i],
                user_attrs=vram_attrs(i, params),
            )
        )
    oom_number = completed
    oom_params = dict(trial_params(11), batch_size=4096)  # the largest batch there is
    study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            params=oom_params,
            distributions=distributions(),
            user_attrs=vram_attrs(oom_number, oom_params, oom=True),
        )
    )
    # The re-run of the OOM'd parameters, running now (Optuna's retry_history marks the link).
    study.add_trial(
        create_trial(
            state=TrialState.RUNNING,
            params=oom_params,
            distributions=distributions(),
            system_attrs={"retry_history": [oom_number]},
        )
    )
    engine = storage.engine
    start = records.now() - dt.timedelta(minutes=5)
    for host, index, gpu, _, _ in GPUS:
        records.register_worker(
            engine, study_name=name, host=host, gpu_index=index, gpu_name=gpu, pid=4242
        )
    steps = [(0, 2, "start", 0), (2, 4, "rampup", 60), (4, 2, "oom", 180)]
    for from_slots, to_slots, reason, after_s in steps:
        host, index, gpu, _, _ = GPUS[0]
        event = records.ConcurrencyEvent(
            at=start + dt.timedelta(seconds=after_s),
            host=host,
            gpu_index=index,
            gpu_name=gpu,
            from_slots=from_slots,
            to_slots=to_slots,
            reason=reason,
            detail=f"{reason} on {gpu}",
        )
        records.record_concurrency_event(engine, study_name=name, event=event)
    best = min(values, key=values.get) if values else None
    return {
        "storage": storage,
        "values": values,
        "best": best,
        "best_params": None if best is None else trial_params(best),
        "oom_trial": oom_number,
        "name": name,
    }


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the commands, on both databases ----------------------------------------------------------


def test_status_lists_every_study_with_budget_and_best(storage_url, capsys):
    first = build_study(storage_url, "first")
    build_study(storage_url, "second", completed=3)

    code, out, _ = run_cli(capsys, "status", "--storage", storage_url, "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert set(rows) == {"first", "second"}
    # A failure whose parameters were re-queued does not use up budget: 10 counted, not 11.
    assert rows["first"]["counted"] == 10
    assert rows["first"]["budget"] == BUDGET
    assert rows["first"]["running"] == 1
    assert rows["first"]["adapter"] == "synthetic"
    assert rows["first"]["best_trial"] == first["best"]
    assert rows["first"]["best_value"] == pytest.approx(first["values"][first["best"]])
    assert rows["second"]["counted"] == 3

    code, out, _ = run_cli(capsys, "status", "--storage", storage_url)
    assert code == 0
    assert "first" in out and "second" in out and f"10/{BUDGET}" in out and "3/12" in out


def test_status_of_one_study_in_detail(storage_url, capsys):
    built = build_study(storage_url)

    code, out, _ = run_cli(capsys, "status", "--storage", storage_url, "--study", "demo", "--json")
    assert code == 0
    detail = json.loads(out)
    assert detail["states"] == {"COMPLETE": 10, "PRUNED": 0, "FAIL": 1, "RUNNING": 1, "WAITING": 0}
    assert detail["counted"] == 10 and detail["retried"] == 1
    assert detail["best"]["number"] == built["best"]
    assert detail["best"]["params"] == built["best_params"]
    assert [(w["host"], w["gpu_name"]) for w in detail["workers"]] == [
        ("node-a", "NVIDIA L4"),
        ("node-b", "NVIDIA L40S"),
    ]
    assert [e["reason"] for e in detail["concurrency_events"]] == ["start", "rampup", "oom"]
    assert [(o["trial"], o["retried"], o["gpu"]) for o in detail["ooms"]] == [
        (10, True, "NVIDIA L4")
    ]
    # VRAM per trial: exactly what each trial wrote, planned and peak, by GPU.
    by_trial = {row["trial"]: row for row in detail["vram"]}
    assert len(by_trial) == 11  # the running re-run has not reached a device yet
    for i in range(10):
        expected = vram_attrs(i, trial_params(i))
        assert by_trial[i]["planned_mb"] == pytest.approx(expected["vram_planned_mb"])
        assert by_trial[i]["vram_peak_mb"] == pytest.approx(expected["vram_peak_mb"])
        assert by_trial[i]["gpu"] == expected["gpu"]
    gpus = {g["gpu"]: g for g in detail["vram_by_gpu"]}
    assert gpus["NVIDIA L4"]["trials"] == 6 and gpus["NVIDIA L4"]["ooms"] == 1
    assert gpus["NVIDIA L40S"]["trials"] == 5
    assert gpus["NVIDIA L40S"]["peak_max_mb"] == pytest.approx(
        max(vram_attrs(i, trial_params(i))["vram_peak_mb"] for i in range(1, 10, 2))
    )
    # The memory model's line comes back from the planned points.
    lines = {line["gpu"]: line for line in detail["memory_lines"]}
    assert lines["NVIDIA L4"]["model_overhead_mb"] == pytest.approx(500.0)
    assert lines["NVIDIA L40S"]["per_sample_mb"] == pytest.approx(0.05)

    code, out, _ = run_cli(capsys, "status", "--storage", storage_url, "--study", "demo")
    assert code == 0
    for words in (
        "Study demo",
        f"10/{BUDGET} counted",
        f"Best: trial #{built['best']}",
        "node-b",
        "OOM events (1)",
        "4 -> 2",
        "VRAM by GPU",
        "NVIDIA L40S",
    ):
        assert words in out


def test_missing_study_lists_the_ones_that_exist(storage_url, capsys):
    build_study(storage_url, "alpha", completed=2)
    for argv in (["status", "--study", "nope"], ["best", "--study", "nope"]):
        code, out, err = run_cli(capsys, *argv, "--storage", storage_url)
        assert code == 2
        assert err.count("\n") == 1 and "'nope'" in err and "alpha" in err
        assert "Traceback" not in err


# --- bad input ---------------------------------------------------------------------------------


def test_unreachable_postgres_names_host_and_port_never_the_password(capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://alice:s3cret-pw@127.0.0.1:{port}/studies"
    for argv in (["status"], ["status", "--study", "x"], ["best", "--study", "x"]):
        code, _, err = run_cli(capsys, *argv, "--storage", url)
        assert code == 2
        assert f"127.0.0.1:{port}" in err and "s3cret-pw" not in err
        assert err.count("\n") == 1


def test_missing_sqlite_file_is_an_error_not_a_new_file(tmp_path, capsys):
    path = tmp_path / "absent.db"
    code, _, err = run_cli(capsys, "status", "--storage", f"sqlite:///{path}")
    assert code == 2 and "absent.db" in err and not path.exists()


def test_empty_storage_says_how_to_start(sqlite_url, capsys):
    from orchestrator.record.store.migrate import open_storage

    open_storage(StorageLocation.parse(sqlite_url))
    code, out, _ = run_cli(capsys, "status", "--storage", sqlite_url)
    assert code == 0 and "No studies" in out and "run ADAPTER" in out


@pytest.mark.parametrize("command", ["status", "best", "report", "dashboard"])
def test_every_command_has_help_with_an_example(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "example:" in out and f"python -m orchestrator {command}" in out


# --- the pure shaping functions ----------------------------------------------------------------


def _trial(number: int, value: float | None, params: dict, attrs: dict, state: str = "COMPLETE"):
    from optuna.trial import TrialState, create_trial

    trial = create_trial(
        state=TrialState[state],
        value=value,
        params=params,
        distributions={k: v for k, v in distributions().items() if k in params},
        user_attrs=attrs,
    )
    trial.number = number
    return trial


def test_best_of_follows_the_direction():
    from orchestrator.show.views import best_of

    trials = [
        _trial(0, 3.0, {"x": 0.0}, {}),
        _trial(1, 1.0, {"x": 1.0}, {}),
        _trial(2, -1.0, {"x": 2.0}, {}),
        _trial(3, 7.0, {"x": 3.0}, {}),
        _trial(4, None, {"x": 4.0}, {}, state="FAIL"),
    ]
    assert best_of(trials, "minimize").number == 2
    assert best_of(trials, "maximize").number == 3
    assert best_of(trials[4:], "minimize") is None


def test_vram_rows_fill_gaps_from_recorded_rows():
    from orchestrator.show.views import vram_rows

    with_attrs = _trial(0, 1.0, {"batch_size": 128}, vram_attrs(0, {"batch_size": 128}))
    without = _trial(1, 2.0, {"batch_size": 256}, {})
    never_ran = _trial(2, None, {"batch_size": 512}, {}, state="WAITING")
    recorded = [
        {
            "trial_number": 1,
            "gpu_name": "H200",
            "gpu_index": 3,
            "host": "h",
            "batch_size": 256,
            "vram_planned_mb": 900.0,
            "vram_peak_mb": 950.0,
            "concurrency": 8,
            "oom": False,
        },
    ]
    rows = vram_rows([never_ran, without, with_attrs], recorded)
    assert [r.trial for r in rows] == [0, 1]
    assert rows[0].gpu == "NVIDIA L4" and rows[0].planned_mb == pytest.approx(502.56)
    assert (rows[1].gpu, rows[1].gpu_index, rows[1].vram_peak_mb) == ("H200", 3, 950.0)
    assert rows[1].peak_over_planned == pytest.approx(950 / 900)


def test_plan_lines_recover_the_memory_model():
    from orchestrator.show.views import VramRow, plan_lines

    def row(gpu: str, batch: int, overhead: float, per: float) -> VramRow:
        return VramRow(0, "COMPLETE", gpu, 0, "h", batch, overhead + per * batch, None, 1, False)

    lines = plan_lines(
        [row("A", b, 300.0, 0.5) for b in (64, 100, 1000)] + [row("B", 256, 42.0, 1.0)]
    )
    a, b = lines
    assert (a.gpu, a.model_overhead_mb, a.per_sample_mb) == (
        "A",
        pytest.approx(300.0),
        pytest.approx(0.5),
    )
    assert b.per_sample_mb == 0.0 and b.at(10_000) == pytest.approx(298.0)  # one batch size: flat


def test_slot_series_steps_per_gpu_and_ends_at_until():
    from orchestrator.record.store.records import ConcurrencyEvent
    from orchestrator.show.views import slot_series

    t0 = dt.datetime(2025, 1, 1, 12, 0, 0)

    def event(seconds: int, host: str, a: int, b: int, reason: str) -> ConcurrencyEvent:
        return ConcurrencyEvent(
            t0 + dt.timedelta(seconds=seconds), host, 0, "L4", a, b, reason, None
        )

    events = [
        event(0, "a", 0, 4, "start"),
        event(5, "b", 0, 2, "start"),
        event(9, "a", 4, 2, "oom"),
    ]
    first, second = slot_series(events, until=t0 + dt.timedelta(seconds=30))
    assert first.label == "a #0 L4" and first.slots == [0, 4, 2, 2]
    assert first.reasons == ["start", "start", "oom", "end"]
    assert second.slots == [0, 2, 2] and second.times[-1] == t0 + dt.timedelta(seconds=30)


def test_to_jsonable_handles_dates_nan_and_dataclasses():
    from orchestrator.show.text import to_jsonable
    from orchestrator.show.views import StudyRow

    row = StudyRow("s", None, "minimize", 0, None, 0, 0, math.nan, None)
    assert to_jsonable(row)["best_value"] is None
    assert to_jsonable({"t": dt.datetime(2025, 1, 2, 3, 4, 5)}) == {"t": "2025-01-02T03:04:05"}
    json.dumps(to_jsonable([row]))


# --- a multi-objective study in the same storage (someone else's, on a shared PostgreSQL) -------


def build_multi_objective_study(url: str, name: str = "pareto") -> None:
    """A study with two objectives and no spec of ours, as another tool would leave it."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from orchestrator.record.store.migrate import open_storage

    study = optuna.create_study(
        study_name=name,
        storage=open_storage(StorageLocation.parse(url)),
        directions=["minimize", "maximize"],
    )
    for i in range(3):
        study.add_trial(
            create_trial(
                params={"x": float(i)},
                distributions={"x": FloatDistribution(-5, 5)},
                values=[float(i), float(-i)],
            )
        )


def test_a_multi_objective_study_is_listed_and_shown_not_a_traceback(storage_url, capsys):
    build_study(storage_url, "single", completed=2)
    build_multi_objective_study(storage_url)

    code, out, err = run_cli(capsys, "status", "--storage", storage_url, "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["pareto"]["direction"] == "multi-objective"
    assert rows["pareto"]["directions"] == ["minimize", "maximize"]
    assert rows["pareto"]["counted"] == 3 and rows["pareto"]["best_value"] is None
    assert rows["single"]["direction"] == "minimize" and rows["single"]["best_trial"] is not None

    code, out, err = run_cli(capsys, "status", "--storage", storage_url)
    assert code == 0, err
    assert "multi-objective" in out and "single" in out

    code, out, err = run_cli(capsys, "status", "--storage", storage_url, "--study", "pareto")
    assert code == 0, err
    assert "multi-objective (minimize, maximize)" in out
    assert "no single best trial" in out
    assert "COMPLETE 3" in out


def test_best_of_a_multi_objective_study_gives_its_pareto_front(sqlite_url, capsys):
    build_multi_objective_study(sqlite_url)  # values (0, 0), (1, -1), (2, -2): #0 dominates
    code, out, err = run_cli(capsys, "best", "--study", "pareto", "--storage", sqlite_url)
    assert code == 0 and "Traceback" not in err and "Pareto front of 'pareto'" in err
    # Each row says whether it is also on the front of the model's expected values.
    assert json.loads(out) == [
        {
            "trial": 0,
            "values": {"value 0": 0.0, "value 1": 0.0},
            "params": {"x": 0.0},
            "observed_front": True,
            "expected_front": True,
        }
    ]


def test_best_lists_a_trial_on_the_expected_front_that_is_off_the_observed_one(
    sqlite_url, capsys, monkeypatch
):
    from orchestrator.commands import best

    build_multi_objective_study(sqlite_url)  # #0 dominates #1 and #2 as observed
    monkeypatch.setattr(best.show_recommended, "front_of", lambda study: [0, 2])
    code, out, err = run_cli(capsys, "best", "--study", "pareto", "--storage", sqlite_url)
    assert code == 0, err
    rows = {row["trial"]: row for row in json.loads(out)}
    assert sorted(rows) == [0, 2]
    assert (rows[2]["observed_front"], rows[2]["expected_front"]) == (False, True)
    assert rows[2]["values"] == {"value 0": 2.0, "value 1": -2.0}
    code, out, _ = run_cli(
        capsys, "best", "--study", "pareto", "--storage", sqlite_url, "--format", "text"
    )
    assert out.rstrip().endswith("front of expected values: #0, #2")


def test_best_of_a_multi_objective_trial_list_is_none():
    from optuna.trial import create_trial

    from orchestrator.show.views import best_of

    trials = [create_trial(values=[1.0, 2.0]), create_trial(values=[0.5, 3.0])]
    assert best_of(trials, "multi-objective") is None
    assert best_of(trials, "minimize") is None  # two values are not one value, whatever we are told


def _detail(**changes):
    from orchestrator.show.views import StudyDetail

    base = {
        "name": "s",
        "adapter": "synthetic",
        "direction": "minimize",
        "budget": 1,
        "epochs": 1,
        "sampler": None,
        "states": {"COMPLETE": 1},
        "counted": 1,
        "retried": 0,
        "best": None,
    }
    return StudyDetail(**{**base, **changes})


def _text(renderable) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120, force_terminal=False).print(renderable)
    return out.getvalue()


def test_one_epoch_and_one_trial_are_singular():
    from orchestrator.show.status_text import render_detail

    text = _text(render_detail(_detail(), limit=20))
    assert "1 epoch)" in text and "1 epochs" not in text
    text = _text(render_detail(_detail(epochs=15, budget=24), limit=20))
    assert "15 epochs" in text


def test_mb_is_one_function_shared_by_status_and_report():
    from orchestrator.show import status_text
    from orchestrator.show.report import page as report
    from orchestrator.show.text import mb_text

    assert mb_text(None) == "-" and mb_text(1638.4) == "1,638"
    assert not hasattr(status_text, "_mb") and not hasattr(report, "_mb")
