"""The GPU check's readings of the device: both probes, the CUDA context, and NVML's memory per
process sampled in a background thread while a study runs.

The readings that need torch's CUDA (`probe_reading`, `context_reading`) run in a child process of
the check, so the check's own process never holds a CUDA context that NVML would list beside the
trials. Any NVML failure is a reading of "nothing", never a crash.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from benchmarks.gpu_check_compare import GpuReading, Sample

MIB = 1024 * 1024


def _reading(source: str, probe: Any) -> GpuReading | None:
    devices = probe.devices()
    if not devices:
        return None
    device = devices[0]
    return GpuReading(source, device.name, device.uuid, device.total_mb, probe.free_mb(device))


def probe_reading() -> dict[str, Any]:
    """GPU 0 through torch, then through NVML (after torch made its context, so both free
    readings see the same memory), and what this machine's torch and driver are."""
    import torch

    from orchestrator.gpu.nvml import NvmlProbe
    from orchestrator.gpu.torch_cuda import TorchProbe

    by_torch = _reading("torch", TorchProbe())
    by_nvml = _reading("nvml", NvmlProbe())
    return {
        "torch": asdict(by_torch) if by_torch else None,
        "nvml": asdict(by_nvml) if by_nvml else None,
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_file": torch.__file__,
        "cuda_available": torch.cuda.is_available(),
        "driver": driver_version(),
    }


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML, no driver: nothing to say
        return None


def process_used_mb(pid: int, uuid: str | None = None) -> float | None:
    """What NVML says process `pid` holds on the GPU (the first one, or `uuid`); None if unseen."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(0)
        )
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == pid and process.usedGpuMemory is not None:
                return process.usedGpuMemory / MIB
    except Exception:
        return None
    return None


def device_used_mb() -> float | None:
    """What NVML says is in use on the first GPU, by every process; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used / MIB
    except Exception:
        return None


def context_reading(adapter_path: str, options: Mapping[str, Any], batch_sizes: list[int]) -> dict:
    """The memory a CUDA process holds outside torch's allocator (context, loaded kernels): one
    epoch of the study's model at each batch size, then NVML's figure for this process less
    torch's reserved memory. The trials' kernels are then loaded here too. Where NVML does not
    list this process under its own pid (a container), the GPU's memory in use, less what it was
    before this process touched CUDA, stands in (nothing else runs on the GPU meanwhile)."""
    before = device_used_mb()  # before the first CUDA call of this process
    import torch

    import adapters
    from orchestrator.planning.calibrate import calibration_epoch

    adapter = adapters.load_path(adapter_path)
    options = adapters.parse_options(adapter, {k: str(v) for k, v in options.items()})
    device = torch.device("cuda", 0)
    readings = []
    for batch_size in batch_sizes:
        calibration_epoch(adapter, options, batch_size, device)
        torch.cuda.synchronize(device)
        reserved = torch.cuda.memory_reserved(device) / MIB
        used, source = process_used_mb(os.getpid()), "process"
        if used is None and before is not None:
            after = device_used_mb()
            used, source = (None, "") if after is None else (after - before, "device")
        readings.append(
            {
                "batch_size": batch_size,
                "nvml_used_mb": used,
                "source": source,
                "reserved_mb": reserved,
                "context_mb": None if used is None else used - reserved,
            }
        )
    return {"readings": readings}


class NvmlSampler:
    """Reads every compute process's memory on one GPU every `interval_s` in a daemon thread."""

    def __init__(self, uuid: str, interval_s: float = 0.05) -> None:
        self.uuid = uuid
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.readings = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
        except Exception as error:
            self.error = f"NVML could not open the GPU: {error}"
            return
        failures = 0
        while not self._stop.is_set():
            at = time.time()
            try:
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception as error:  # keep going: one bad read is not the end of the study
                failures += 1
                self.error = f"NVML could not list the GPU's processes: {error}"
                if failures > 50:
                    return
            else:
                self.readings += 1
                self.samples.extend(
                    Sample(at, int(p.pid), p.usedGpuMemory / MIB)
                    for p in processes
                    if p.usedGpuMemory is not None
                )
            self._stop.wait(self.interval_s)
