"""GPUs through torch's CUDA: the fallback where NVML is missing or fails.

Asking torch creates a CUDA context in this process (a few hundred MB on each GPU it touches), so
NVML comes first, and torch is asked only where a GPU driver is present
(`orchestrator.gpu._gpu_driver_present`). Trial processes come from a fork server started as a
process of its own (or by `spawn`), so a context here is never forked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from orchestrator.gpu.base import Device
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch
else:
    torch = LazyImport("torch")

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class TorchProbe:
    """Lists the GPUs torch sees (CUDA_VISIBLE_DEVICES applied by CUDA itself)."""

    def devices(self) -> list[Device]:
        try:
            if not torch.cuda.is_available():
                return []
            found = []
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                uuid = str(getattr(props, "uuid", "") or f"cuda-{index}")
                found.append(
                    Device(
                        index=index,
                        name=props.name,
                        uuid=uuid if uuid.startswith(("GPU-", "MIG-", "cuda-")) else f"GPU-{uuid}",
                        total_mb=props.total_memory / MIB,
                        kind="cuda",
                    )
                )
            return found
        except Exception as error:  # a broken driver or build: no GPU, never a crash
            log.debug("torch found no GPU: %s", error)
            return []

    def free_mb(self, device: Device) -> float:
        """Free MB on the device as CUDA reports it; 0.0 when it cannot say."""
        try:
            free, _total = torch.cuda.mem_get_info(device.index)
            return free / MIB
        except Exception as error:
            log.warning("torch could not read free memory of %s: %s", device.label, error)
            return 0.0
