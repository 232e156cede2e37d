"""GPU discovery: `--gpus auto|none|0,2|0:24576|sim:MB[,sim:MB...]` to a probe and its devices.

`INDEX:MB` uses at most MB of that GPU, to share it with other work or to try a large GPU as a
smaller one: the device is planned and admitted as an MB-sized GPU (`LimitedProbe` reports what is
free of that part), and its trial processes cannot allocate past it
(`torch.cuda.set_per_process_memory_fraction`).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.errors import UserError
from orchestrator.gpu.base import Device, Probe
from orchestrator.gpu.sim import SimLedger, SimProbe, make_sim_devices
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import ctypes

    from orchestrator.gpu import nvml, torch_cuda
else:
    # The real probes load only when a GPU is looked for: `--gpus` is checked by every
    # command's parser, and `--help` should not pay for ctypes and the probes' modules.
    ctypes = LazyImport("ctypes")
    nvml = LazyImport("orchestrator.gpu.nvml")
    torch_cuda = LazyImport("orchestrator.gpu.torch_cuda")

__all__ = [
    "Device",
    "LimitedProbe",
    "NoProbe",
    "Probe",
    "SimLedger",
    "SimProbe",
    "check_gpu_spec",
    "check_gpus_exist",
    "select_devices",
]

SPEC_FORMS = (
    "auto, none, GPU indices such as 0,2, a part of one such as 0:24576 (MB), "
    "or simulated sizes such as sim:24576"
)


class NoProbe:
    """No GPU: nothing to list."""

    def devices(self) -> list[Device]:
        return []

    def free_mb(self, device: Device) -> float:
        return 0.0


def _parse_sim(spec: str) -> list[float]:
    sizes = []
    for part in spec.split(","):
        part = part.strip()
        if not part.startswith("sim:"):
            raise UserError(
                f"--gpus {spec!r}: real and simulated GPUs do not mix; write sim:MB[,sim:MB...]"
            )
        try:
            size = float(part[4:])
        except ValueError:
            size = math.nan
        if not math.isfinite(size):
            raise UserError(
                f"--gpus {part!r}: the simulated size must be a number of MB, e.g. sim:24576"
            )
        if size <= 0:
            raise UserError(
                f"--gpus {part!r}: the simulated size must be more than 0 MB, e.g. sim:24576"
            )
        sizes.append(size)
    return sizes


def _parse_indices(spec: str) -> list[tuple[int, float | None]]:
    """(GPU index, MB it may use or None for all of it) for each part of `spec`."""
    chosen: list[tuple[int, float | None]] = []
    for part in (p.strip() for p in spec.split(",")):
        index, _, limit = part.partition(":")
        if not index.isdigit():
            raise UserError(f"--gpus {spec!r}: use {SPEC_FORMS}")
        mb = None
        if limit:
            try:
                mb = float(limit)
            except ValueError:
                mb = math.nan
            if not math.isfinite(mb) or mb <= 0:
                raise UserError(
                    f"--gpus {part!r}: the part of GPU {index} to use must be a number of MB "
                    "more than 0, e.g. 0:24576"
                )
        chosen.append((int(index), mb))
    indices = [index for index, _ in chosen]
    if len(set(indices)) != len(indices):
        raise UserError(f"--gpus {spec!r} names a GPU twice: name each once, e.g. --gpus 0,1")
    return chosen


class LimitedProbe:
    """A probe over GPUs of which only a part is ours (`--gpus 0:24576`): what is free of that
    part, counting all the rest of the GPU as held by others, and any overflow of theirs."""

    def __init__(self, inner: Probe, devices: list[Device]) -> None:
        self._inner = inner
        self._devices = devices

    def devices(self) -> list[Device]:
        return list(self._devices)

    def free_mb(self, device: Device) -> float:
        free = self._inner.free_mb(device)
        if device.physical_mb is None:
            return free
        return max(0.0, free - (device.physical_mb - device.total_mb))


def _limited(device: Device, mb: float | None) -> Device:
    if mb is None or mb >= device.total_mb:
        return device
    return replace(device, total_mb=float(mb), physical_mb=device.total_mb)


def check_gpu_spec(spec: str) -> str:
    """`--gpus SPEC` checked for form (no GPU is probed): the spec, or a UserError saying why."""
    spec = spec.strip()
    if spec in ("auto", "none"):
        return spec
    if not spec:
        raise UserError(f"--gpus is empty: use {SPEC_FORMS}")
    if "sim:" in spec:
        _parse_sim(spec)
    else:
        _parse_indices(spec)
    return spec


def check_gpus_exist(spec: str) -> None:
    """GPU indices in `--gpus` name GPUs of this machine (probed; simulated and auto always do)."""
    spec = check_gpu_spec(spec)
    if spec in ("auto", "none") or spec.startswith("sim:"):
        return
    select_devices(spec)


def select_devices(spec: str = "auto", *, sim_dir: str | None = None) -> tuple[Probe, list[Device]]:
    """The probe and the devices that `--gpus SPEC` names; an impossible choice is a UserError."""
    spec = (spec or "auto").strip()
    if spec == "none":
        return NoProbe(), []
    if spec.startswith("sim:"):
        devices = make_sim_devices(_parse_sim(spec), sim_dir)
        return SimProbe(devices), devices
    probe = _real_probe()
    found = probe.devices()
    if spec == "auto":
        return probe, found
    wanted = _parse_indices(spec)
    by_index = {device.index: device for device in found}
    missing = [index for index, _ in wanted if index not in by_index]
    if missing:
        have = ", ".join(str(i) for i in sorted(by_index))
        fix = (
            f"GPUs here: {have}"
            if have
            else "none here: use --gpus none, or sim:MB to simulate one"
        )
        raise UserError(f"--gpus {spec!r}: no GPU {missing[0]} on this machine ({fix})")
    devices = [_limited(by_index[index], mb) for index, mb in wanted]
    if any(device.physical_mb is not None for device in devices):
        return LimitedProbe(probe, devices), devices
    return probe, devices


def _real_probe() -> Probe:
    """NVML where it works, torch's CUDA otherwise, else no GPU: detection never crashes."""
    for loader in (_nvml_probe, _torch_probe):
        probe = loader()
        if probe is not None and probe.devices():
            return probe
    return NoProbe()


def _nvml_probe() -> Probe:
    return nvml.NvmlProbe()  # without pynvml, or without a driver, it finds no device


def _torch_probe() -> Probe | None:
    if not _gpu_driver_present():
        return None  # torch could see no GPU either: spare this process torch's import (1-2 s)
    return torch_cuda.TorchProbe()


def _gpu_driver_present() -> bool:
    """Whether a GPU driver that torch could use is on this machine: NVIDIA's CUDA driver library
    loads, or AMD's compute device (ROCm) exists. Off Linux, assume it may be."""
    if not sys.platform.startswith("linux"):
        return True
    if os.path.exists("/dev/kfd"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True
