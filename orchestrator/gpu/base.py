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

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index} {self.name}"


class Probe(Protocol):
    """Finds devices and reports their free memory on demand (any failure means "no GPU")."""

    def devices(self) -> list[Device]: ...

    def free_mb(self, device: Device) -> float: ...
