"""GPU probes: NVML and torch, where any failure means "no GPU", and `--gpus` selection."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections import namedtuple
from pathlib import Path

import pytest

import orchestrator.gpu as gpu
from orchestrator.errors import UserError
from orchestrator.gpu.nvml import MIB, NvmlProbe, visible_nvml_indices
from orchestrator.gpu.torch_cuda import TorchProbe

Memory = namedtuple("Memory", "total free used")
REPO = Path(__file__).resolve().parents[1]
UUIDS = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]


class NVMLError(Exception):
    pass


def fake_nvml(
    totals_mb: list[float], free_mb: list[float], *, fail_init: bool = False
) -> types.ModuleType:
    """A stand-in for the pynvml module with the calls the probe makes, over made-up GPUs."""
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError

    def init() -> None:
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def memory(handle: int) -> Memory:
        total = int(totals_mb[handle] * MIB)
        free = int(free_mb[handle] * MIB)
        return Memory(total, free, total - free)

    module.nvmlInit = init
    module.nvmlDeviceGetCount = lambda: len(totals_mb)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetUUID = lambda h: UUIDS[h]
    module.nvmlDeviceGetName = lambda h: b"NVIDIA L4" if h == 0 else "NVIDIA H100 80GB HBM3"
    module.nvmlDeviceGetMemoryInfo = memory
    module.nvmlDeviceGetHandleByUUID = lambda uuid: UUIDS.index(uuid)
    return module


def test_nvml_lists_devices_with_torch_indices(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([23034, 81559], [20000, 80000]))
    devices = NvmlProbe(environ={}).devices()
    assert [(d.index, d.name, d.uuid, d.kind) for d in devices] == [
        (0, "NVIDIA L4", UUIDS[0], "cuda"),
        (1, "NVIDIA H100 80GB HBM3", UUIDS[1], "cuda"),
    ]
    assert devices[0].total_mb == pytest.approx(23034)


def test_nvml_honours_cuda_visible_devices(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([100, 200, 300], [50, 150, 250]))
    probe = NvmlProbe(environ={"CUDA_VISIBLE_DEVICES": "2,GPU-aaaa"})
    devices = probe.devices()
    assert [(d.index, d.uuid, d.total_mb) for d in devices] == [
        (0, UUIDS[2], 300),
        (1, UUIDS[0], 100),
    ]
    assert probe.free_mb(devices[0]) == pytest.approx(250)
    assert NvmlProbe(environ={"CUDA_VISIBLE_DEVICES": ""}).devices() == []


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("-1", []),
        ("1", [1]),
        ("1,0", [1, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first index it does not have
        ("GPU-bbbb", [1]),
        ("GPU-", []),  # a prefix that matches several GPUs is not one GPU
        ("0,0", [0]),
        ("MIG-abc", []),
    ],
)
def test_visible_devices_parsing(visible: str | None, expected: list[int]) -> None:
    assert visible_nvml_indices(visible, UUIDS) == expected


def test_nvml_failure_means_no_gpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([100], [50], fail_init=True))
    probe = NvmlProbe(environ={})
    assert probe.devices() == []
    assert probe.free_mb(gpu.Device(0, "x", UUIDS[0], 100.0)) == 0.0


def test_missing_pynvml_means_no_gpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert NvmlProbe(environ={}).devices() == []


def test_torch_probe_failure_means_no_gpu(monkeypatch) -> None:
    import torch

    def broken() -> bool:
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert TorchProbe().devices() == []


def test_no_probe_works_means_no_gpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([100], [50], fail_init=True))
    monkeypatch.setattr(gpu, "_torch_probe", lambda: None)
    probe, devices = gpu.select_devices("auto")
    assert devices == [] and isinstance(probe, gpu.NoProbe)
    with pytest.raises(UserError, match="no GPU 7 on this machine"):
        gpu.select_devices("7")


def test_without_a_gpu_driver_torch_is_not_asked(monkeypatch) -> None:
    """No CUDA driver library and no ROCm device: torch could see no GPU, so the probe does not
    import it (1-2 s of CPU in every `run` and `worker` of a CPU-only machine)."""
    import ctypes

    def no_library(name: str, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(gpu.os.path, "exists", lambda path: False)
    assert gpu._gpu_driver_present() is False and gpu._torch_probe() is None
    monkeypatch.setattr(gpu.os.path, "exists", lambda path: path == "/dev/kfd")
    assert gpu._gpu_driver_present() is True and isinstance(gpu._torch_probe(), TorchProbe)


def test_a_cpu_only_run_never_imports_torch_to_look_for_gpus(tmp_path) -> None:
    if gpu._gpu_driver_present():
        pytest.skip("this machine has a GPU driver: torch is asked, as it should be")
    code = (
        "import sys; from orchestrator.gpu import select_devices; "
        "probe, found = select_devices('auto'); print(found, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "False"], done.stdout


def test_selecting_gpus_by_index(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([100, 200, 300], [50, 150, 250]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe, devices = gpu.select_devices("2,0")
    assert isinstance(probe, NvmlProbe)
    assert [d.index for d in devices] == [2, 0]
    with pytest.raises(UserError, match=r"no GPU 3 on this machine \(GPUs here: 0, 1, 2\)"):
        gpu.select_devices("0,3")
    with pytest.raises(UserError, match="use auto, none"):
        gpu.select_devices("first")


def test_part_of_a_gpu_is_planned_and_watched_as_a_gpu_of_that_size(monkeypatch) -> None:
    # GPU 0 has 100 MB of which 80 are free; the study may use 50 of it.
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([100, 200], [80, 150]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe, devices = gpu.select_devices("0:50,1")
    limited, whole = devices
    assert (limited.total_mb, limited.physical_mb) == (50.0, 100.0)
    assert (whole.total_mb, whole.physical_mb) == (200.0, None)
    assert isinstance(probe, gpu.LimitedProbe)
    # Free of its 50 MB: the 20 MB in use count against the other 50 first, so 30 are free.
    assert probe.free_mb(limited) == 30.0
    assert probe.free_mb(whole) == 150.0
    # A part as large as the GPU, or larger, is the whole GPU.
    _, (all_of_it,) = gpu.select_devices("0:500")
    assert all_of_it.total_mb == 100.0 and all_of_it.physical_mb is None


@pytest.mark.parametrize(
    ("spec", "words"),
    [("0:abc", "must be a number of MB"), ("0:-5", "more than 0"), ("0:50,0", "names a GPU twice")],
)
def test_bad_parts_of_gpus(spec: str, words: str) -> None:
    with pytest.raises(UserError, match=words):
        gpu.check_gpu_spec(spec)


def test_planning_part_of_a_gpu(monkeypatch, capsys, tmp_path) -> None:
    from adapters.base import MemoryModel
    from orchestrator.planning.planner import plan_node

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([81920], [81000]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _, devices = gpu.select_devices("0:24576")
    (plan,) = plan_node(devices, MemoryModel(1500.0, 10.0), cpu_bound=False, cpu_cores=2).gpus
    assert plan.usable_mb == 0.8 * 24576  # planned as the 24 GB it may use
    assert plan.batch_bounds == (64, 1816)  # what fits in 19,661 MB, not in 65,536


def test_none_and_simulated(tmp_path) -> None:
    probe, devices = gpu.select_devices("none")
    assert devices == [] and isinstance(probe, gpu.NoProbe)
    probe, devices = gpu.select_devices("sim:1000,sim:2048", sim_dir=str(tmp_path))
    assert [(d.kind, d.total_mb) for d in devices] == [("sim", 1000.0), ("sim", 2048.0)]
    assert probe.free_mb(devices[1]) == 2048.0


@pytest.mark.parametrize(
    ("spec", "words"),
    [("sim:-5", "more than 0 MB"), ("sim:abc", "number of MB"), ("sim:100,0", "do not mix")],
)
def test_bad_simulated_specs(spec: str, words: str, tmp_path) -> None:
    with pytest.raises(UserError, match=words):
        gpu.select_devices(spec, sim_dir=str(tmp_path))


@pytest.mark.gpu
def test_real_gpu_probes_agree() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    by_torch = TorchProbe().devices()
    by_nvml = NvmlProbe().devices()
    assert by_torch and len(by_nvml) == len(by_torch)
    for device in by_nvml:
        assert device.total_mb > 1024
        assert 0 < NvmlProbe().free_mb(device) <= device.total_mb
    assert {d.uuid for d in by_nvml} == {d.uuid for d in by_torch}
    assert 0 < TorchProbe().free_mb(by_torch[0]) <= by_torch[0].total_mb
