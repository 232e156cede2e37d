"""GPU discovery: `--gpus auto|none|0,2|sim:MB[,sim:MB...]` to a probe and its devices."""

from __future__ import annotations

from orchestrator.errors import UserError
from orchestrator.gpu.base import Device, Probe
from orchestrator.gpu.sim import SimLedger, SimProbe, make_sim_devices

__all__ = ["Device", "NoProbe", "Probe", "SimLedger", "SimProbe", "select_devices"]


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
            raise UserError(
                f"--gpus {part!r}: the simulated size must be a number of MB, e.g. sim:24576"
            ) from None
        if size <= 0:
            raise UserError(
                f"--gpus {part!r}: the simulated size must be more than 0 MB, e.g. sim:24576"
            )
        sizes.append(size)
    return sizes


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
    try:
        wanted = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise UserError(
            f"--gpus {spec!r}: use auto, none, GPU indices such as 0,2, or sim:MB"
        ) from None
    by_index = {device.index: device for device in found}
    missing = [index for index in wanted if index not in by_index]
    if missing:
        have = ", ".join(str(i) for i in sorted(by_index)) or "none"
        raise UserError(f"--gpus {spec!r}: no GPU {missing[0]} on this machine (GPUs here: {have})")
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
