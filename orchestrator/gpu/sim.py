"""Simulated GPUs: a device of a chosen size whose memory is a ledger shared by processes.

A simulated trial holds its memory model's MB (times `--sim-memory-scale`) in the ledger while it
runs and gets a real `torch.cuda.OutOfMemoryError` when the ledger would pass the device's size,
so everything above the probe (planner, supervisor, watchdog, records) runs unchanged on a CPU.
The ledger is a small JSON file: the supervisor, its spawned trial processes and a test standing
in for "another process" all see one truth. A change (allocate, release) holds an exclusive file
lock and replaces the file whole; a read takes no lock, as reading NVML waits for no one: a trial
process frozen (SIGSTOP) while it held the lock would otherwise stall its host's every look at
free memory until it woke.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.gpu.base import Device
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch
else:
    torch = LazyImport("torch")

SIM_NAME = "Simulated GPU"


class SimLedger:
    """Who holds how many MB of one simulated device."""

    def __init__(self, path: str | os.PathLike[str], total_mb: float) -> None:
        self.path = Path(path)
        self.total_mb = float(total_mb)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, float]]:
        lock_path = self.path.with_suffix(self.path.suffix + ".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                holders = self._read()
                before = dict(holders)
                yield holders
                if holders != before:
                    self._write(holders)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, float]:
        try:
            holders = json.loads(self.path.read_text() or "{}")
        except FileNotFoundError:
            return {}
        # A holder named after a process that is gone (killed, crashed) holds nothing any more.
        return {name: mb for name, mb in holders.items() if _alive(name)}

    def _write(self, holders: dict[str, float]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(holders))
        tmp.replace(self.path)

    def used_mb(self) -> float:
        return float(sum(self._read().values()))

    def free_mb(self) -> float:
        return max(0.0, self.total_mb - self.used_mb())

    def allocate(self, holder: str, mb: float) -> None:
        """Hold `mb` for `holder`, or raise torch's CUDA out-of-memory error if it does not fit."""
        with self._locked() as holders:
            used = sum(holders.values())
            if used + mb > self.total_mb:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory (simulated). Tried to allocate {mb:.0f} MiB; "
                    f"{self.total_mb:.0f} MiB total, {used:.0f} MiB already held"
                )
            holders[holder] = holders.get(holder, 0.0) + float(mb)

    def held_mb(self, holder: str) -> float:
        return float(self._read().get(holder, 0.0))

    def release(self, holder: str) -> None:
        with self._locked() as holders:
            holders.pop(holder, None)


def process_holder(pid: int | None = None) -> str:
    """The ledger name of a process's allocation: freed automatically if the process dies."""
    return f"pid:{pid or os.getpid()}"


def _alive(holder: str) -> bool:
    if not holder.startswith("pid:"):
        return True
    try:
        os.kill(int(holder[4:]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def make_sim_devices(sizes_mb: list[float], directory: str | None = None) -> list[Device]:
    """Simulated devices of the given sizes, each with a fresh ledger file."""
    if directory is None:
        directory = tempfile.mkdtemp(prefix="orchestrator-sim-")
        atexit.register(shutil.rmtree, directory, True)  # ours to clean when this process ends
    folder = Path(directory)
    devices = []
    for index, size in enumerate(sizes_mb):
        if size <= 0:
            raise ValueError(
                f"sim:{size:g} is not a size: write the simulated VRAM in MB, e.g. sim:24576"
            )
        path = folder / f"sim{index}.ledger"
        path.write_text("{}")
        devices.append(
            Device(
                index=index,
                name=f"{SIM_NAME} {_size_words(size)}",
                uuid=f"sim-{index}-{int(size)}",
                total_mb=float(size),
                kind="sim",
                ledger_path=str(path),
            )
        )
    return devices


def _size_words(size_mb: float) -> str:
    """24576 -> "24 GB", 6000 -> "5.9 GB", 1000 -> "1000 MB": how people name a card's memory."""
    if size_mb < 1024:
        return f"{size_mb:g} MB"
    return f"{size_mb / 1024:.3g} GB" if size_mb % 1024 else f"{size_mb / 1024:g} GB"


class SimProbe:
    """Probe over simulated devices: free memory is what their ledgers say."""

    def __init__(self, devices: list[Device]) -> None:
        self._devices = devices

    def devices(self) -> list[Device]:
        return list(self._devices)

    def free_mb(self, device: Device) -> float:
        assert device.ledger_path is not None
        return SimLedger(device.ledger_path, device.total_mb).free_mb()
