"""One small interface over every way of finding GPUs: list devices, ask their free memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Device:
    """A GPU a supervisor can fill. `kind` is "cuda" for real ones and "sim" for simulated ones."""

    index: int
    name: str
    uuid: str
    total_mb: float
    kind: str = "cuda"
    ledger_path: str | None = None  # simulated devices: the shared file that holds their memory
    physical_mb: float | None = None  # `--gpus 0:MB`: the whole GPU's memory, of which

    # `total_mb` is the part this study may use
    @property
    def label(self) -> str:
        part = f" ({self.total_mb:,.0f} MB of it)" if self.physical_mb else ""
        return f"{self.kind}:{self.index} {self.name}{part}"


class Probe(Protocol):
    """Finds devices and reports their free memory on demand (any failure means "no GPU")."""

    def devices(self) -> list[Device]: ...

    def free_mb(self, device: Device) -> float: ...
