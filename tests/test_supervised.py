"""The supervised forecaster: its memory model against a measurement, training, reporting, data."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch

import adapters
from adapters import forecaster, return_windows, tft
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, parse_options
from orchestrator.errors import UserError

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
# Small enough that a trial takes a second or two on one CPU thread.
TINY = {
    "learning_rate": 3e-3,
    "batch_size": 64,
    "width": 16,
    "depth": 1,
    "dropout": 0.1,
    "window": 16,
    "weight_decay": 1e-4,
}


def saved_activation_bytes(model: torch.nn.Module, batch: int, window: int) -> int:
    """Bytes of the distinct tensors autograd saves for backward in one forward pass."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:  # weights are state, not activations
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(torch.randn(batch, window))
    return sum(saved.values())


@pytest.mark.parametrize(
    ("width", "window", "depth"), [(64, 64, 2), (32, 48, 1), (128, 32, 3), (16, 128, 2)]
)
def test_activation_count_matches_what_autograd_saves(width, window, depth):
    torch.manual_seed(0)
    model = forecaster.build_forecaster(width, window, depth, horizon=4, dropout=0.1).train()
    # The difference between two batch sizes is the per-sample part alone.
    measured = (
        saved_activation_bytes(model, 16, window) - saved_activation_bytes(model, 8, window)
    ) / 8
    declared = forecaster.activation_bytes_per_sample(width, window, depth)
    assert measured > 0
    assert measured <= declared <= 1.05 * measured


@pytest.mark.parametrize(("width", "window", "depth"), [(64, 64, 2), (128, 32, 3)])
def test_parameter_count_is_exact(width, window, depth):
    model = forecaster.build_forecaster(width, window, depth, horizon=4)
    assert forecaster.model_parameters(width, window, depth, 4) == sum(
        p.numel() for p in model.parameters()
    )


def test_declared_memory_model_bounds_the_largest_model_in_the_search_space():
    adapter = tft.adapter
    options = parse_options(adapter, {})
    width, window, depth = options["max_width"], options["max_window"], options["max_depth"]
    model = forecaster.build_forecaster(width, window, depth, options["horizon"], 0.1).train()
    per_sample = (
        saved_activation_bytes(model, 16, window) - saved_activation_bytes(model, 8, window)
    ) / 8
    state = 4 * sum(p.numel() * p.element_size() for p in model.parameters())

    memory = adapter.memory_model(options)
    mb = 1024 * 1024
    assert per_sample / mb <= memory.per_sample_mb <= 1.5 * per_sample / mb
    assert memory.model_overhead_mb >= state / mb + forecaster.CUDA_CONTEXT_MB
    assert memory.model_overhead_mb <= state / mb + forecaster.CUDA_CONTEXT_MB + 1
    # The attributes the planner reads agree with the method at the defaults.
    assert adapter.per_sample_mb == pytest.approx(memory.per_sample_mb)
    assert adapter.model_overhead_mb == pytest.approx(memory.model_overhead_mb)


def test_memory_model_grows_with_the_search_space():
    small = tft.adapter.memory_model(parse_options(tft.adapter, {}))
    large = tft.adapter.memory_model(
        parse_options(tft.adapter, ["max_width=256", "max_window=256", "max_depth=4"])
    )
    assert large.per_sample_mb > 10 * small.per_sample_mb
    assert large.model_overhead_mb > small.model_overhead_mb


def test_search_space_and_batch_size_range():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    options = parse_options(tft.adapter, {})
    for _ in range(30):
        params = tft.adapter.suggest(study.ask(), options)
        assert BATCH_SIZE_MIN <= params["batch_size"] <= BATCH_SIZE_MAX
        assert params["width"] % forecaster.HEADS == 0
        assert tft.MIN_WIDTH <= params["width"] <= options["max_width"]
        assert tft.MIN_WINDOW <= params["window"] <= options["max_window"]
        assert 1 <= params["depth"] <= options["max_depth"]
        assert {"learning_rate", "dropout"} <= set(params)


def test_reports_validation_loss_every_epoch_and_returns_the_best():
    reported: list[tuple[int, float]] = []
    value = tft.adapter.train(
        TINY,
        epochs=3,
        device=CPU,
        options=parse_options(tft.adapter, {}),
        report=lambda epoch, loss: reported.append((epoch, loss)),
    )
    assert [epoch for epoch, _ in reported] == [0, 1, 2]
    assert all(math.isfinite(loss) and loss > 0 for _, loss in reported)
    assert value == min(loss for _, loss in reported)


def test_same_seed_same_result_and_seed_changes_it():
    options = parse_options(tft.adapter, {})

    def run(opts):
        return tft.adapter.train(TINY, epochs=1, device=CPU, options=opts, report=lambda e, v: None)

    assert run(options) == run(options)
    assert run(options) != run({**options, "seed": 1})


def training_batch_sizes(monkeypatch, params, options) -> list[int]:
    """The first dimension of the model's input at every training step (evaluation excluded)."""
    seen: list[int] = []
    build = forecaster.build_forecaster

    def recording_build(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(
            lambda module, inputs: seen.append(inputs[0].shape[0]) if module.training else None
        )
        return model

    monkeypatch.setattr(tft, "build_forecaster", recording_build)
    tft.adapter.train(params, epochs=2, device=CPU, options=options, report=lambda e, v: None)
    return seen


def test_batch_size_2048_reaches_the_training_loop_unclamped(monkeypatch):
    # The default series has about 1,180 training windows: fewer than the batch proposed.
    options = parse_options(tft.adapter, {})
    returns = len(return_windows.load_close_prices("", options["steps"], 0)) - 1
    windows = len(return_windows.split_windows(returns, TINY["window"], options["horizon"])[0])
    assert windows < 2048
    seen = training_batch_sizes(monkeypatch, {**TINY, "batch_size": 2048}, options)
    assert seen == [2048, 2048]  # one full step per epoch, every step as large as proposed


def test_every_step_uses_exactly_batch_size_samples(monkeypatch):
    options = parse_options(tft.adapter, {})
    returns = len(return_windows.load_close_prices("", options["steps"], 0)) - 1
    windows = len(return_windows.split_windows(returns, TINY["window"], options["horizon"])[0])
    assert windows % 64  # the old last batch of each epoch was smaller
    seen = training_batch_sizes(monkeypatch, TINY, options)
    assert seen == [64] * (2 * math.ceil(windows / 64))


def test_objective_is_pruned_after_a_poor_first_epoch():
    class PruneAll(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return True

    study = optuna.create_study(pruner=PruneAll())
    study.enqueue_trial(TINY)
    trial = study.ask()
    with pytest.raises(optuna.TrialPruned):
        tft.adapter.objective(trial, CPU, 5, parse_options(tft.adapter, {}))
    assert list(study._storage.get_trial(trial._trial_id).intermediate_values) == [0]


def _day(index: int) -> str:
    import datetime

    return (datetime.date(2024, 1, 1) + datetime.timedelta(days=index)).isoformat()


def test_prices_from_a_csv_file(tmp_path):
    from adapters.envs.prices import synthetic_prices

    path = tmp_path / "prices.csv"
    rows = "\n".join(  # one price a day: a date twice is refused
        f"{_day(i)},{price:.6f}" for i, price in enumerate(synthetic_prices(600, seed=3))
    )
    path.write_text("date,close\n" + rows + "\n")
    options = parse_options(tft.adapter, {"data": str(path)})
    losses: list[float] = []
    tft.adapter.train(
        TINY, epochs=1, device=CPU, options=options, report=lambda e, v: losses.append(v)
    )
    assert len(losses) == 1 and math.isfinite(losses[0])

    bad = tmp_path / "bad.csv"
    bad.write_text("date,open\n2024-01-01,1.0\n")
    with pytest.raises(UserError, match="close"):
        tft.adapter.train(
            TINY,
            epochs=1,
            device=CPU,
            options={**options, "data": str(bad)},
            report=lambda e, v: None,
        )


def test_validation_windows_lie_after_the_training_targets():
    train, val = return_windows.split_windows(1000, window=32, horizon=4)
    assert max(train) + 32 + 4 <= min(val)
    assert min(val) + 32 + 4 <= 1000 and max(val) + 36 == 1000
    with pytest.raises(UserError, match="too short"):
        return_windows.split_windows(100, window=64, horizon=4)


def test_returns_are_standardised_on_the_training_part_only():
    prices = np.exp(np.cumsum(np.r_[np.full(800, 0.01), np.full(200, 0.5)]))
    returns = return_windows.standardised_returns(prices)
    assert abs(returns[:799].mean()) < 1e-3  # the later, different part does not leak in
    assert returns[-1] > 100


def test_bad_size_options_are_user_errors():
    with pytest.raises(UserError, match="max_width"):
        tft.adapter.memory_model({"max_width": 50})
    with pytest.raises(UserError, match="steps"):
        tft.adapter.memory_model({"steps": 10})


def write_prices(path: Path, count: int) -> Path:
    from adapters.envs.prices import synthetic_prices

    rows = "\n".join(
        f"{_day(i)},{price:.6f}" for i, price in enumerate(synthetic_prices(count, seed=3))
    )
    path.write_text("date,close\n" + rows + "\n")
    return path


def test_check_options_loads_the_prices_and_checks_the_largest_window(tmp_path):
    check = tft.adapter.check_options
    check(parse_options(tft.adapter, {}))  # the defaults are fine
    with pytest.raises(UserError, match=r"absent\.csv does not exist"):
        check(parse_options(tft.adapter, {"data": str(tmp_path / "absent.csv")}))
    bad = tmp_path / "bad.csv"
    bad.write_text("date,open\n2024-01-01,1.0\n")
    with pytest.raises(UserError, match=r"bad\.csv has no `close` column"):
        check(parse_options(tft.adapter, {"data": str(bad)}))

    # load_prices accepts 200 rows, but windows of 40 and more leave nothing held out.
    short = write_prices(tmp_path / "short.csv", 200)
    check(parse_options(tft.adapter, {"data": str(short), "max_window": "32"}))
    with pytest.raises(UserError, match=r"short\.csv.*200 prices.*max_window=32"):
        check(parse_options(tft.adapter, {"data": str(short)}))
    with pytest.raises(UserError, match="steps=120.*too short"):
        check(parse_options(tft.adapter, {"steps": "120"}))


@pytest.mark.parametrize("data", ["bad.csv", "absent.csv"])
def test_run_with_bad_data_exits_2_in_one_line_and_stores_nothing(tmp_path, capsys, data):
    from orchestrator.cli import main

    (tmp_path / "bad.csv").write_text("date,open\n2024-01-01,1.0\n")
    database = tmp_path / "study.db"
    code = main(
        ["run", "tft", "--data", str(tmp_path / data), "--storage", f"sqlite:///{database}"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and data in err
    assert err.startswith("error: price file" if data == "bad.csv" else "error: --data")
    assert not database.exists()


@pytest.mark.filterwarnings("ignore:The distribution is specified by")
def test_calibration_params_are_the_largest_model_of_the_search_space():
    options = parse_options(tft.adapter, ["max_width=128", "max_window=100", "max_depth=3"])
    params = tft.adapter.calibration_params(options)
    # The largest values the sampler can reach: windows step by 8 from 16, so 96, not 100.
    assert (params["width"], params["window"], params["depth"]) == (128, 96, 3)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = [tft.adapter.suggest(study.ask(), options) for _ in range(60)]
    assert max(p["window"] for p in drawn) == 96
    assert params["dropout"] > 0  # dropout masks are part of what training keeps
    assert set(params) == set(tft.adapter.default_params)


def test_registered_as_tft_and_meets_the_protocol():
    adapter = adapters.get("tft")
    assert adapter is tft.adapter
    assert adapters.base.problems_with(adapter) == []
    assert adapter.workload_class == "supervised" and adapter.direction == "minimize"
    assert isinstance(adapter.default_trials, int) and adapter.default_trials >= 4


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_plan_differs_from_dqn_on_a_48_gb_gpu(tmp_path):
    storage = f"sqlite:///{tmp_path / 'plan.db'}"
    tft = _cli(
        "plan", "tft", "--gpus", "sim:49152", "--cpu-cores", "16", "--storage", storage, "--json"
    )
    dqn = _cli(
        "plan", "dqn", "--gpus", "sim:49152", "--cpu-cores", "16", "--storage", storage, "--json"
    )
    assert tft.returncode == 0, tft.stderr
    assert dqn.returncode == 0, dqn.stderr
    assert tft.stdout != dqn.stdout
    # A GPU-sized search space needs more per trial than the swarm's share of 48 GB: fewer slots.
    big = _cli(
        "plan",
        "tft",
        "--gpus",
        "sim:49152",
        "--storage",
        storage,
        "--option",
        "max_width=256",
        "--option",
        "max_window=256",
        "--option",
        "max_depth=4",
    )
    assert big.returncode == 0, big.stderr
    assert "limited by swarm size" not in big.stdout


def test_a_small_study_with_the_median_pruner_finds_a_best_validation_loss():
    """In process; `python -m orchestrator run tft` is run in tests/test_user_adapters.py."""
    options = parse_options(
        tft.adapter, ["max_width=32", "max_window=24", "max_depth=1", "steps=1200"]
    )
    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    )
    study.optimize(lambda trial: tft.adapter.objective(trial, CPU, 3, options), n_trials=4)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) >= 2
    assert study.best_value == min(min(t.intermediate_values.values()) for t in complete)
    for trial in study.trials:  # pruned ones stopped early, finished ones reported every epoch
        assert len(trial.intermediate_values) == (
            3 if trial in complete else len(trial.intermediate_values)
        )
        assert 1 <= len(trial.intermediate_values) <= 3


@pytest.mark.gpu
def test_cuda_peak_stays_under_the_memory_model():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    adapter = tft.adapter
    options = parse_options(adapter, {})
    params = {
        **adapter.default_params,
        "width": options["max_width"],
        "window": options["max_window"],
        "depth": options["max_depth"],
        "batch_size": 1024,
    }
    torch.cuda.reset_peak_memory_stats()
    adapter.train(
        params,
        epochs=1,
        device=torch.device("cuda"),
        options={**options, "steps": 6000},
        report=lambda e, v: None,
    )
    peak_mb = torch.cuda.max_memory_reserved() / 1024**2
    planned = adapter.memory_model(options).planned_mb(1024) - forecaster.CUDA_CONTEXT_MB
    assert peak_mb <= planned
