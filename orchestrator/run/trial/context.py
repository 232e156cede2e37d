"""What a trial process makes once and reuses for every trial it runs.

Imports, the storage connection, the study with Optuna's per-study cache of trials, the adapter,
the pruner, the sampler (whose swarm view is kept up to date trial after trial) and, on a GPU,
the CUDA context: a warm trial process pays for each of these once, not once per trial.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import adapters
from adapters.base import memory_model_of, uses_torch
from adapters.study_adapter import resolve_adapter
from orchestrator.gpu.sim import SimLedger
from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import study_id_of
from orchestrator.record.store.storage import create_storage
from orchestrator.record.study.spec import load_spec, pruner_for
from orchestrator.record.trials.retry import stale_trial_callback
from orchestrator.record.trials.tracking import tracker_for
from orchestrator.run.messages import WorkerConfig
from orchestrator.run.trial.stored_samplers import user_sampler, walked_once
from samplers import make_sampler, sampler_kind

if TYPE_CHECKING:
    import optuna
    import torch
    from optuna.storages import RDBStorage

    from adapters.base import MemoryModel
    from orchestrator.gpu.base import Device
    from orchestrator.record.study.spec import StudySpec
else:
    optuna = LazyImport("optuna")
    torch = LazyImport("torch")


def pin_device(device: Device | None) -> None:
    """Make the trial's GPU the only one this process sees (before CUDA starts)."""
    if device is not None and device.kind == "cuda":
        # By UUID: NVML numbers GPUs by PCI bus, CUDA by speed unless told otherwise.
        uuid = device.uuid
        os.environ["CUDA_VISIBLE_DEVICES"] = uuid if uuid.startswith("GPU-") else str(device.index)


class TrialContext:
    """The study, adapter and device of one trial process, opened once."""

    def __init__(self, config: WorkerConfig) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.config = config
        self.storage: RDBStorage = create_storage(
            config.storage,
            heartbeat=True,
            heartbeat_stale_trial_callback=stale_trial_callback,
            wait=True,  # started by a running study: ride out an outage while opening it
        )
        self.study: optuna.Study = optuna.load_study(
            study_name=config.study_name, storage=self.storage
        )
        device = config.device
        self.gpu_name = device.name if device else "cpu"
        self.on_cuda = device is not None and device.kind == "cuda"
        self.device_name = "cuda:0" if self.on_cuda else "cpu"  # the one GPU it sees, or none
        self._torch_device: torch.device | None = None
        if self.on_cuda:
            self.torch_device()  # CUDA's limits are set before anything allocates
        self.ledger: SimLedger | None = (
            SimLedger(device.ledger_path, device.total_mb)
            if device is not None and device.kind == "sim"
            else None
        )
        self.spec: StudySpec | None = None
        self._samplers: dict[tuple[int, int], Any] = {}
        self.refresh_spec()

    def torch_device(self) -> torch.device:
        """The trial's torch device. Torch is imported here, on first use, so a process whose
        adapter uses no torch never imports it (about 1.5 s of CPU)."""
        if self._torch_device is None:
            torch.set_num_threads(max(1, self.config.threads))
            device = self.config.device
            if self.on_cuda and device is not None and device.physical_mb:
                # `--gpus 0:MB`: a trial cannot take more than the study's part of the GPU.
                torch.cuda.set_per_process_memory_fraction(device.total_mb / device.physical_mb, 0)
            self._torch_device = torch.device(self.device_name)
        return self._torch_device

    def training_device(self) -> Any:
        """What the adapter's `train` gets as its device: torch's, or for an adapter that uses
        no torch (`uses_torch = False`) the device's name."""

        return self.torch_device() if uses_torch(self.adapter) else self.device_name

    @property
    def engine(self) -> Any:
        return self.storage.engine

    @property
    def study_id(self) -> int:
        return study_id_of(self.study)

    def refresh_spec(self) -> StudySpec:
        """Read the study's settings again: a resumed `run` may have raised the budget or changed
        the options since this process started. Anything built from the old ones is rebuilt."""

        spec = load_spec(self.study)
        if spec is None:
            raise RuntimeError(f"study {self.config.study_name!r} has no orchestrator settings")
        if spec != self.spec:
            self.adapter = resolve_adapter(spec)
            self.metric = adapters.metric_name(self.adapter, spec.options)
            self.tracker = tracker_for(spec, self.config.study_name, metric=self.metric)
            self.pruner = pruner_for(spec)
            self.memory: MemoryModel = memory_model_of(self.adapter, spec.options)
            self._samplers.clear()
            self.spec = spec
        return spec

    def sampler_for(self, bounds: tuple[int, int], trial_number: int | None) -> Any:
        """The study's sampler for this GPU's batch bounds.

        The swarm is one object per bounds, kept for the life of the process, so its view of the
        study is brought up to date trial after trial instead of rebuilt. Optuna's own samplers
        draw from one random generator per object: they are made anew for each trial, seeded by
        its number, so processes, resumed runs and nodes never repeat each other."""

        spec = self.spec
        assert spec is not None
        if spec.sampler_pickle is not None:  # an Optuna sampler object given to `optimize`
            if bounds not in self._samplers:
                self._samplers[bounds] = user_sampler(spec.sampler_pickle, bounds)
            return self._samplers[bounds]
        n_objectives = len(spec.all_directions)
        kind = sampler_kind(spec.sampler)
        if kind.needs_grid:  # one walk of the stored grid, shared through the storage
            if bounds not in self._samplers:
                grid = make_sampler(spec.sampler, seed=spec.seed, grid=spec.grid)
                self._samplers[bounds] = walked_once(grid, bounds)
            return self._samplers[bounds]
        if kind.kept:
            if bounds not in self._samplers:
                self._samplers[bounds] = make_sampler(
                    spec.sampler,
                    seed=spec.seed,
                    swarm_size=spec.swarm_size,
                    bounds={"batch_size": bounds},
                    n_objectives=n_objectives,
                )
            return self._samplers[bounds]
        return make_sampler(
            spec.sampler,
            seed=spec.seed,
            swarm_size=spec.swarm_size,
            bounds={"batch_size": bounds},
            independent_seed_offset=trial_number or 0,
            n_objectives=n_objectives,
        )
