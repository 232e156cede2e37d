"""Memory models: the fitting maths, the choice between declared and measured, refining from
finished trials, and calibration (its decisions here; the real measurement on a GPU, marked gpu)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.base import BaseAdapter, MemoryModel
from orchestrator.errors import UserError
from orchestrator.planning.calibrate import (
    AdapterRef,
    Measurement,
    calibrate,
    calibration_epoch,
    calibration_params,
)
from orchestrator.planning.memory import (
    choose_memory_model,
    existing_engine,
    fit_from_trials,
    fit_memory_model,
    measured_models,
    save_learnt_model,
)
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.records import MeasuredMemoryModel, now

if TYPE_CHECKING:
    import torch

    from adapters.base import Report

# --- fitting ----------------------------------------------------------------------------------


def test_two_points_give_the_line_through_them() -> None:
    model = fit_memory_model([(64, 812.0), (4096, 2828.0)])
    assert model.per_sample_mb == pytest.approx(0.5)
    assert model.model_overhead_mb == pytest.approx(780.0)


def test_noisy_points_give_an_envelope_over_every_measurement() -> None:
    points = [(64, 330.0), (128, 318.0), (512, 420.0), (1024, 505.0), (2048, 700.0)]
    model = fit_memory_model(points)
    assert 0.15 < model.per_sample_mb < 0.25
    assert all(model.planned_mb(batch) >= peak - 1e-9 for batch, peak in points)
    assert any(model.planned_mb(batch) == pytest.approx(peak) for batch, peak in points)


def test_memory_that_does_not_grow_with_the_batch_is_all_overhead() -> None:
    model = fit_memory_model([(64, 512.0), (4096, 510.0)])
    assert model == MemoryModel(512.0, 0.0)


def test_a_negative_intercept_becomes_no_overhead() -> None:
    points = [(100, 10.0), (200, 40.0)]  # the line would cross zero at batch 67
    model = fit_memory_model(points)
    assert model.model_overhead_mb == 0.0
    assert all(model.planned_mb(batch) >= peak for batch, peak in points)


def test_one_batch_size_says_nothing_about_the_slope() -> None:
    with pytest.raises(ValueError, match="two or more batch sizes"):
        fit_memory_model([(256, 400.0), (256, 410.0)])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 100_000), st.floats(min_value=0.0, max_value=1e6)),
        min_size=2,
        max_size=30,
    ).filter(lambda pts: len({b for b, _ in pts}) >= 2)
)
def test_the_fit_covers_every_point_and_is_never_negative(points) -> None:
    model = fit_memory_model(points)
    assert model.model_overhead_mb >= 0 and model.per_sample_mb >= 0
    for batch, peak in points:
        assert model.planned_mb(batch) >= peak - 1e-6 * max(1.0, peak)


# --- which model ------------------------------------------------------------------------------


def test_measured_wins_over_declared_and_says_so() -> None:
    declared = MemoryModel(300.0, 0.0002)
    assert choose_memory_model(declared, None) == (declared, "declared")
    measured = MeasuredMemoryModel(410.0, 0.001, "calibration", 2, now())
    assert choose_memory_model(declared, measured) == (
        MemoryModel(410.0, 0.001),
        "measured (calibration, 2 samples)",
    )


def row(
    batch: int,
    peak: float | None,
    *,
    gpu: str = "NVIDIA L4",
    state: str = "COMPLETE",
    oom: bool = False,
) -> dict:
    return {"gpu_name": gpu, "batch_size": batch, "vram_peak_mb": peak, "state": state, "oom": oom}


def test_only_finished_measured_trials_on_that_gpu_count() -> None:
    rows = [
        row(64, 400.0),
        row(128, 420.0, state="PRUNED"),
        row(256, 460.0),
        row(512, 540.0),
        row(1024, 700.0),
        row(4096, 99999.0, oom=True, state="FAIL"),
        row(2048, 5000.0, gpu="NVIDIA H100"),
        row(2048, None),
        row(2048, 9000.0, state="RUNNING"),
    ]
    fitted = fit_from_trials(rows, "NVIDIA L4")
    assert fitted is not None
    model, samples = fitted
    assert samples == 5
    assert model.planned_mb(1024) >= 700.0 and model.planned_mb(4096) < 5000.0
    assert fit_from_trials(rows, "NVIDIA H100") is None  # one trial says too little
    assert fit_from_trials([row(256, 400.0)] * 6, "NVIDIA L4") is None  # one batch size


# --- the storage ------------------------------------------------------------------------------


def test_planning_reads_no_storage_that_is_not_there(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    assert existing_engine(StorageLocation.parse(url)) is None
    assert (
        measured_models(StorageLocation.parse(url), "synthetic", MemoryModel(1, 1), ["NVIDIA L4"])
        == {}
    )
    assert not (tmp_path / "absent.db").exists()
    import sqlite3

    sqlite3.connect(tmp_path / "other.db").execute(
        "CREATE TABLE unrelated (x INTEGER)"
    ).connection.close()
    assert existing_engine(StorageLocation.parse(f"sqlite:///{tmp_path / 'other.db'}")) is None


def test_finished_trials_refine_the_stored_model(sqlite_url) -> None:
    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.store.records import (
        load_memory_model,
        record_trial_vram,
        save_memory_model,
    )

    engine = open_storage(StorageLocation.parse(sqlite_url)).engine
    save_memory_model(
        engine, adapter="dqn", gpu_name="NVIDIA L4", model_overhead_mb=300.0, per_sample_mb=0.0002,
        source="calibration", samples=2,
    )  # fmt: skip
    for number, (batch, peak) in enumerate([(64, 512.0), (256, 530.0), (512, 560.0)]):
        record_trial_vram(
            engine, study_name="dqn-a", trial_number=number, host="h", gpu_index=0, gpu_name="NVIDIA L4",
            batch_size=batch, vram_peak_mb=peak, concurrency=4, oom=False, state="COMPLETE",
        )  # fmt: skip
    assert (
        save_learnt_model(engine, adapter="dqn", gpu_name="NVIDIA L4", study_names=["dqn-a"])
        is None
    )
    assert load_memory_model(engine, adapter="dqn", gpu_name="NVIDIA L4").source == "calibration"

    for number, (batch, peak) in enumerate([(1024, 620.0), (2048, 735.0)], start=3):
        record_trial_vram(
            engine, study_name="dqn-b", trial_number=number, host="h", gpu_index=0, gpu_name="NVIDIA L4",
            batch_size=batch, vram_peak_mb=peak, concurrency=4, oom=False, state="COMPLETE",
        )  # fmt: skip
    model = save_learnt_model(
        engine, adapter="dqn", gpu_name="NVIDIA L4", study_names=["dqn-a", "dqn-b"]
    )
    assert model is not None and model.model_overhead_mb > 490 and 0.05 < model.per_sample_mb < 0.15
    stored = load_memory_model(engine, adapter="dqn", gpu_name="NVIDIA L4")
    assert (stored.source, stored.samples) == ("trials", 5)
    assert stored.per_sample_mb == pytest.approx(model.per_sample_mb)

    found = measured_models(
        StorageLocation.parse(sqlite_url),
        "dqn",
        MemoryModel(300.0, 0.0002),
        ["NVIDIA L4", "NVIDIA H100"],
    )
    assert list(found) == ["NVIDIA L4"]
    assert found["NVIDIA L4"][1] == "measured (trials, 5 samples)"


# --- calibration ------------------------------------------------------------------------------


def test_calibration_needs_a_batch_size_to_vary() -> None:
    class NoBatch(BaseAdapter):
        name = "no-batch"
        default_params = {"learning_rate": 1e-3}

    with pytest.raises(UserError, match="no batch_size in its default_params"):
        calibration_params(NoBatch(), 64)
    assert calibration_params(GpuMemoryAdapter(), 2048) == {
        "learning_rate": 1e-3,
        "batch_size": 2048,
    }


class LargestModelAdapter(BaseAdapter):
    """Says which parameters its largest model has, and records what it is trained with."""

    name = "largest"
    options = {"max_hidden": 512}
    default_params = {"learning_rate": 1e-3, "hidden": 32}  # no batch_size: not needed here

    def __init__(self) -> None:
        self.trained: list[dict[str, Any]] = []

    def calibration_params(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.default_params, "hidden": int(options["max_hidden"])}

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        self.trained.append({**params, "epochs": epochs, "device": str(device)})
        return 0.0


def test_calibration_measures_the_largest_model_when_the_adapter_says_which() -> None:
    adapter = LargestModelAdapter()
    assert calibration_params(adapter, 4096, {"max_hidden": 1024}) == {
        "learning_rate": 1e-3,
        "hidden": 1024,
        "batch_size": 4096,
    }
    # Without options (the early check in `plan`), the adapter's default options are used.
    assert calibration_params(adapter, 64)["hidden"] == 512
    # What a calibration process trains: those parameters, one epoch, on the device given.
    import torch

    calibration_epoch(adapter, {"max_hidden": 2048}, 256, torch.device("cpu"))
    assert adapter.trained == [
        {"learning_rate": 1e-3, "hidden": 2048, "batch_size": 256, "epochs": 1, "device": "cpu"}
    ]


def test_tft_is_calibrated_at_the_maxima_of_its_search_space() -> None:
    from adapters import tft as supervised
    from adapters.base import parse_options

    options = parse_options(supervised.adapter, ["max_width=256", "max_window=128", "max_depth=4"])
    params = calibration_params(supervised.adapter, 1024, options)
    assert (params["width"], params["window"], params["depth"]) == (256, 128, 4)
    assert params["batch_size"] == 1024
    defaults = supervised.adapter.default_params
    assert params["width"] * params["window"] * params["depth"] > 10 * (
        defaults["width"] * defaults["window"] * defaults["depth"]
    )


def test_calibration_halves_a_batch_that_runs_out_of_memory() -> None:
    import torch

    asked: list[int] = []

    def measure(
        ref: AdapterRef, options: Mapping[str, Any], batch_size: int, device_index: int
    ) -> Measurement:
        asked.append(batch_size)
        if batch_size > 1024:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Measurement(batch_size, 200.0 + 0.25 * batch_size, 150.0 + 0.25 * batch_size)

    result = calibrate(
        AdapterRef(name="synthetic"), {}, device_index=0, gpu_name="NVIDIA T4", measure=measure
    )
    assert asked == [64, 4096, 2048, 1024]
    assert [m.batch_size for m in result.measurements] == [64, 1024]
    assert result.model.model_overhead_mb == pytest.approx(200.0)
    assert result.model.per_sample_mb == pytest.approx(0.25)


class GpuMemoryAdapter(BaseAdapter):
    """A small MLP trained on random data: its memory grows with the batch, as a real model's does."""

    name = "gpu-memory"
    workload_class = "supervised"
    direction = "minimize"
    default_params = {"learning_rate": 1e-3, "batch_size": 256}

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        import torch

        torch.manual_seed(0)
        width = 1024
        model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        ).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=params["learning_rate"])
        x = torch.randn(params["batch_size"], width, device=device)
        y = torch.randn(params["batch_size"], 1, device=device)
        for epoch in range(epochs):
            for _ in range(5):
                loss = ((model(x) - y) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            report(epoch, float(loss))
        return float(loss)


@pytest.mark.gpu
def test_calibration_on_a_real_gpu(tmp_path, capsys) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    from orchestrator.cli import main

    target = f"{__name__}:GpuMemoryAdapter"
    name = torch.cuda.get_device_name(0)
    result = calibrate(AdapterRef(path=target), {}, device_index=0, gpu_name=name)
    low, high = result.measurements
    assert high.peak_reserved_mb > low.peak_reserved_mb > 0
    # 4096 x 1024 floats of input, hidden activations and their gradients: tens of MB more.
    assert result.model.per_sample_mb > 0.005
    assert all(
        result.model.planned_mb(m.batch_size) >= m.peak_reserved_mb - 1e-6
        for m in result.measurements
    )

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    code = main(
        ["plan", "--adapter-path", target, "--gpus", "0", "--calibrate", "--storage", storage]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert f"calibrated gpu-memory on {name}" in out
    assert "measured (calibration, 2 samples)" in out


def test_the_documented_example_can_be_calibrated(monkeypatch) -> None:
    from pathlib import Path

    import adapters

    monkeypatch.syspath_prepend(
        str(Path(__file__).resolve().parents[1] / "examples" / "my_model_adapter")
    )
    example = adapters.load_path("my_model_adapter:adapter")
    params = calibration_params(example, 4096, {"samples": 4096})
    assert params == {"learning_rate": 1e-3, "hidden": 256, "batch_size": 4096}
