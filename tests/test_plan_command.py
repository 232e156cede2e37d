"""`python -m orchestrator plan`: what a person sees, on simulated GPUs and on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.synthetic import SyntheticAdapter
from orchestrator.cli import main
from orchestrator.record.store.location import StorageLocation
from tests.waiting import patient

ROOT = Path(__file__).resolve().parents[1]
DQN_LIKE = ["--option", "overhead_mb=300", "--option", "per_sample_mb=0.0002"]
TFT_LIKE = ["--option", "overhead_mb=2000", "--option", "per_sample_mb=0.05"]


class RlSynthetic(SyntheticAdapter):
    """The synthetic objective in the RL workload class: CPU-bound in the planner's eyes."""

    name = "rl-synthetic"
    workload_class = "rl"


def plan(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_seed_numbers_on_an_l4_and_an_h100(capsys, storage) -> None:
    code, out, _ = plan(capsys, "synthetic", "--gpus", "sim:24576", "--storage", storage, *DQN_LIKE)
    assert code == 0
    assert "20 trials at once, limited by swarm size 20" in out
    assert "declared: 300 MB + 0.0002 MB per sample" in out
    code, out, _ = plan(capsys, "synthetic", "--gpus", "sim:81920", "--storage", storage, *DQN_LIKE)
    assert "20 trials at once" in out and "batch bounds  64..4096" in out
    code, out, _ = plan(capsys, "synthetic", "--gpus", "sim:24576", "--storage", storage, *TFT_LIKE)
    assert "9 trials at once, limited by VRAM" in out
    # The batch range is what fits the GPU alone, whatever runs beside it.
    assert "batch bounds  64..4096 (what fits this GPU alone)" in out
    assert "memory budget 19,661 MB; each trial admitted by its own footprint" in out
    assert "at once       smallest 2,003 MB (batch 64): 9; typical 2,026 MB (batch 512): 9;" in out


def test_two_gpus_show_different_bounds_in_json(capsys, storage) -> None:
    code, out, _ = plan(
        capsys,
        "synthetic",
        "--gpus",
        "sim:24576,sim:49152",
        "--storage",
        storage,
        "--json",
        *TFT_LIKE,
    )
    assert code == 0
    data = json.loads(out)
    assert data["adapter"] == "synthetic" and data["cpu_bound"] is False
    assert [g["slots"] for g in data["gpus"]] == [9, 19]
    assert [g["batch_bounds"] for g in data["gpus"]] == [[64, 4096], [64, 4096]]
    assert [g["at_once"]["largest"] for g in data["gpus"]] == [8, 17]
    assert [g["device"]["total_mb"] for g in data["gpus"]] == [24576, 49152]
    assert data["total_slots"] == 28
    assert not Path(
        storage.removeprefix("sqlite:///")
    ).exists()  # planning never creates a database


def test_cpu_bound_work_is_capped_by_cores(capsys, storage, monkeypatch) -> None:
    import orchestrator.planning.cpu_cores

    monkeypatch.setattr(orchestrator.planning.cpu_cores, "usable_cpu_cores", lambda: 6)
    code, out, _ = plan(
        capsys,
        "--adapter-path",
        f"{__name__}:RlSynthetic",
        "--gpus",
        "sim:81920,sim:81920",
        "--storage",
        storage,
        *DQN_LIKE,
    )
    assert code == 0
    assert "rl is CPU-bound: at most 6 trials at once over all GPUs" in out
    assert (
        out.count(
            "3 trials at once, limited by CPU cores (6 usable, shared by 2 GPUs; VRAM fits 20)"
        )
        == 2
    )
    assert "in all: at most 6 trials at once on 2 GPUs" in out


def test_planning_for_a_host_with_more_cores(capsys, storage) -> None:
    rl = ["--adapter-path", f"{__name__}:RlSynthetic", "--storage", storage, *DQN_LIKE]
    code, out, _ = plan(capsys, *rl, "--gpus", "sim:24576", "--cpu-cores", "32")
    assert "20 trials at once, limited by swarm size 20" in out
    code, out, _ = plan(capsys, *rl, "--gpus", "sim:24576", "--cpu-cores", "1")
    assert "1 trial at once, limited by CPU cores (1 usable; VRAM fits 20)" in out
    code, _, err = plan(capsys, *rl, "--gpus", "sim:24576", "--cpu-cores", "0")
    assert code == 2 and "--cpu-cores 0" in err


def test_user_concurrency_and_swarm_size(capsys, storage) -> None:
    code, out, _ = plan(
        capsys,
        "synthetic",
        "--gpus",
        "sim:24576",
        "--storage",
        storage,
        "--concurrency",
        "4",
        *TFT_LIKE,
    )
    assert "4 trials at once, limited by --concurrency 4 (VRAM fits 9)" in out
    code, out, _ = plan(
        capsys,
        "synthetic",
        "--gpus",
        "sim:24576",
        "--storage",
        storage,
        "--swarm-size",
        "5",
        *TFT_LIKE,
    )
    assert "5 trials at once, limited by swarm size 5" in out


def test_a_measured_model_is_used_and_named(capsys, storage) -> None:
    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.store.records import save_memory_model

    engine = open_storage(StorageLocation.parse(storage)).engine
    save_memory_model(
        engine,
        adapter="synthetic",
        gpu_name="Simulated GPU 24 GB",
        model_overhead_mb=4000.0,
        per_sample_mb=0.1,
        source="calibration",
        samples=2,
    )
    code, out, _ = plan(
        capsys, "synthetic", "--gpus", "sim:24576,sim:49152", "--storage", storage, "--json"
    )
    data = json.loads(out)
    measured, declared = data["gpus"]
    assert measured["memory_model"]["source"] == "measured (calibration, 2 samples)"
    assert measured["slots"] == 4  # 19660.8 MB usable / (4000 + 64 x 0.1) MB
    assert declared["memory_model"]["source"] == "declared"
    code, out, _ = plan(capsys, "synthetic", "--gpus", "sim:24576", "--storage", storage)
    assert "memory model  measured (calibration, 2 samples): 4,000 MB + 0.1 MB per sample" in out


def test_a_model_that_does_not_fit_is_warned_about(capsys, storage) -> None:
    code, out, _ = plan(capsys, "synthetic", "--gpus", "sim:2048", "--storage", storage, *TFT_LIKE)
    assert code == 0
    assert "1 trial at once" in out
    assert "warning: one trial needs 2,003 MB, more than the 1,638 MB usable" in out


def test_no_gpu_is_one_line(capsys, storage) -> None:
    code, out, err = plan(capsys, "synthetic", "--gpus", "none", "--storage", storage)
    assert code == 0 and err == ""
    assert out.count("\n") == 1
    assert out.startswith(
        "no GPU (--gpus none): synthetic runs 1 trial at a time on the CPU, batch sizes 64..4096"
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpus", "sim:-5"], "the simulated size must be more than 0 MB"),
        (["--gpus", "sim:lots"], "must be a number of MB"),
        (["--swarm-size", "0"], "--swarm-size 0 must be at least 1"),
        (["--concurrency", "0"], "--concurrency 0"),
        (["--option", "colour=blue"], "has no option 'colour'"),
        (["--calibrate", "--gpus", "sim:1024"], "--calibrate needs a real CUDA GPU"),
        (["--calibrate", "--gpus", "none"], "--calibrate needs a real CUDA GPU but none was found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, storage, args: list[str], words: str) -> None:
    code, out, err = plan(capsys, "synthetic", "--storage", storage, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err


def test_unknown_adapter_is_one_line(capsys, storage) -> None:
    code, _, err = plan(capsys, "nosuchthing", "--gpus", "none", "--storage", storage)
    assert code == 2 and "unknown adapter 'nosuchthing'" in err and err.count("\n") == 1


def test_on_this_machine_without_a_gpu(tmp_path) -> None:
    """The real command line, GPU detection included: one line, no traceback, no database."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    db = tmp_path / "study.db"
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "synthetic", "--storage", f"sqlite:///{db}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "no GPU found (--gpus auto): synthetic runs 1 trial at a time on the CPU"
    )
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr
    assert not db.exists()


def test_a_gpu_this_machine_does_not_have(capsys, storage) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, out, err = plan(capsys, "synthetic", "--gpus", "7", "--storage", storage)
    assert code == 2 and out == ""
    assert err == (
        "error: --gpus '7': no GPU 7 on this machine "
        "(none here: use --gpus none, or sim:MB to simulate one)\n"
    )
