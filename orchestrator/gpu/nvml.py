"""GPUs through NVML (`pynvml` from nvidia-ml-py), imported lazily; any NVML failure means "no GPU".

NVML numbers GPUs by PCI bus and ignores CUDA_VISIBLE_DEVICES, while torch's `cuda:N` counts only
the visible GPUs. A Device's index is the one torch uses, so the visible list is honoured here:
entries are NVML indices or (prefixes of) GPU UUIDs, and CUDA stops at the first it cannot read.
Torch orders GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; on a host with mixed GPU
models set that variable (or pin each trial process by UUID) so both agree.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from orchestrator.gpu.base import Device

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_nvml_indices(visible: str | None, uuids: list[str]) -> list[int]:
    """NVML indices in torch's order for a CUDA_VISIBLE_DEVICES value (None: all of them)."""
    if visible is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.isdigit():
            index = int(entry)
            if index >= len(uuids):
                break
        elif entry.startswith("GPU-"):
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        else:
            break  # empty, -1, MIG-... : CUDA ignores the rest of the list
        if index in chosen:
            break
        chosen.append(index)
    return chosen


class NvmlProbe:
    """Lists the visible GPUs with their total memory; free memory on demand."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._nvml: Any = None
        self._uuid_by_index: dict[int, str] = {}

    def _init(self) -> Any:
        if self._nvml is None:
            # Looked up as each probe starts, not through LazyImport's copy made once a process:
            # the module `sys.modules` holds then is the one probed (a stand-in, in the tests).
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        return self._nvml

    def devices(self) -> list[Device]:
        try:
            return self._devices()
        except Exception as error:  # ImportError, NVMLError, a broken driver: all mean no GPU
            log.debug("NVML found no GPU: %s", error)
            return []

    def _devices(self) -> list[Device]:
        nvml = self._init()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(nvml.nvmlDeviceGetUUID(handle)) for handle in handles]
        order = visible_nvml_indices(self._environ.get("CUDA_VISIBLE_DEVICES"), uuids)
        found = []
        for cuda_index, nvml_index in enumerate(order):
            handle = handles[nvml_index]
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                Device(
                    index=cuda_index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=uuids[nvml_index],
                    total_mb=memory.total / MIB,
                    kind="cuda",
                )
            )
        return found

    def free_mb(self, device: Device) -> float:
        """Free MB on the device, seen by every process on it; 0.0 when NVML cannot say."""
        try:
            nvml = self._init()
            handle = nvml.nvmlDeviceGetHandleByUUID(device.uuid)
            return nvml.nvmlDeviceGetMemoryInfo(handle).free / MIB
        except Exception as error:
            log.warning("NVML could not read free memory of %s: %s", device.label, error)
            return 0.0
