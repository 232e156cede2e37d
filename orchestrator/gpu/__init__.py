"""GPU discovery: `--gpus auto|none|0,2|sim:MB[,sim:MB...]` to a probe and its devices."""

from __future__ import annotations

import math

from orchestrator.errors import UserError
from orchestrator.gpu.base import Device, Probe
from orchestrator.gpu.sim import SimLedger, SimProbe, make_sim_devices

__all__ = [
    "Device",
    "NoProbe",
    "Probe",
    "SimLedger",
    "SimProbe",
    "check_gpu_spec",
    "check_gpus_exist",
    "select_devices",
]

SPEC_FORMS = "auto, none, GPU indices such as 0,2, or simulated sizes such as sim:24576"


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


def _parse_indices(spec: str) -> list[int]:
    parts = [part.strip() for part in spec.split(",")]
    if not all(part.isdigit() for part in parts):
        raise UserError(f"--gpus {spec!r}: use {SPEC_FORMS}")
    indices = [int(part) for part in parts]
    if len(set(indices)) != len(indices):
        raise UserError(f"--gpus {spec!r} names a GPU twice: name each once, e.g. --gpus 0,1")
    return indices


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
    missing = [index for index in wanted if index not in by_index]
    if missing:
        have = ", ".join(str(i) for i in sorted(by_index))
        fix = (
            f"GPUs here: {have}"
            if have
            else "none here: use --gpus none, or sim:MB to simulate one"
        )
        raise UserError(f"--gpus {spec!r}: no GPU {missing[0]} on this machine ({fix})")
    return probe, [by_index[index] for index in wanted]


def _real_probe() -> Probe:
    """NVML where it works, torch's CUDA otherwise, else no GPU: detection never crashes."""
    for loader in (_nvml_probe, _torch_probe):
        probe = loader()
        if probe is not None and probe.devices():
            return probe
    return NoProbe()


def _nvml_probe() -> Probe | None:
    try:
        from orchestrator.gpu.nvml import NvmlProbe
    except ImportError:
        return None
    return NvmlProbe()


def _torch_probe() -> Probe | None:
    try:
        from orchestrator.gpu.torch_cuda import TorchProbe
    except ImportError:
        return None
    return TorchProbe()
