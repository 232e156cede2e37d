"""The names under which a trial's record is stored, spelled once.

A trial process writes these user attributes (optuna-dashboard shows them); the views, the
report, the MLflow tags, the dashboard note, the memory model's refit and the swarm's history read
them back. `BATCH_SIZE` is the parameter the plan bounds: an adapter or objective draws it with
`trial.suggest_int("batch_size", ...)`, and admission sizes a trial by it.
"""

from __future__ import annotations

# Where the trial ran.
HOST = "host"
PID = "pid"
GPU = "gpu"  # the GPU's name
GPU_INDEX = "gpu_index"
LOG_FILE = "log_file"
# What the plan allowed, and what the trial used.
BATCH_SIZE = "batch_size"
BATCH_BOUNDS = "batch_bounds"
CONCURRENCY = "concurrency"  # trials admitted on its GPU when it was, itself included
VRAM_PLANNED_MB = "vram_planned_mb"
# When its GPU's supervisor let it start (UTC, ISO 8601): a trial is asked for, and so stamped
# by Optuna, before it waits for room on its GPU, so its memory is held only from here.
ADMITTED_AT = "admitted_at"
VRAM_PEAK_MB = "vram_peak_mb"
# How it ended.
OOM = "oom"  # True when it ran out of GPU memory
ERROR = "error"  # the first 500 characters of what it raised
FAIL_REASON = "fail_reason"  # why it failed without an error: "nan", "exit", "timeout"
# A re-run of an earlier trial's parameters (after an OOM, an interruption, a lost process).
RETRY_OF = "retry_of"
RETRY_REASON = "retry_reason"
# A system attribute of a re-run whose fused group ran out of memory: the most members of the
# group it trains in next (half its group: orchestrator/run/oom_policy.py).
FUSE_AT_MOST = "fuse_at_most"
# Checkpoints (orchestrator/record/checkpoints/files.py; docs/checkpoints.md has the contract).
CHECKPOINT = "checkpoint"  # {"artifact_id": str, "epoch": int}: the trial's latest, every save
CHECKPOINT_FROM = "checkpoint_from"  # a trial number: training starts from its latest checkpoint
TRAIN_UNTIL_EPOCH = "train_until_epoch"  # train up to this epoch (inclusive), then end COMPLETE
CHECKPOINT_UNSAVED = "checkpoint_unsaved"  # {"epoch": int, "error": str}: its last failed save
RESUMED_FROM_EPOCH = "resumed_from_epoch"  # the epoch of the checkpoint training went on from
# `--intensify N`: a re-run of the study's recommended trial (its number), the Nth of them, and
# the seeds it trains with: the adapter's seed option plus this offset (orchestrator/intensify.py).
INTENSIFY_OF = "intensify_of"
SEED_OFFSET = "seed_offset"
