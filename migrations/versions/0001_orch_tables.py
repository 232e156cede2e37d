"""orch_* tables: workers, per-trial VRAM, concurrency events, memory models, batch limits

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orch_workers",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=True),
        sa.Column("gpu_name", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False),
        sa.Column("stopped_at", sa.DateTime, nullable=True),
    )
    op.create_index("ix_orch_workers_study_name", "orch_workers", ["study_name"])
    op.create_table(
        "orch_trial_vram",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("trial_number", sa.Integer, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=True),
        sa.Column("gpu_name", sa.String(255), nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=True),
        sa.Column("vram_planned_mb", sa.Float, nullable=True),
        sa.Column("vram_peak_mb", sa.Float, nullable=True),
        sa.Column("concurrency", sa.Integer, nullable=True),
        sa.Column("oom", sa.Boolean, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_orch_trial_vram_study_name", "orch_trial_vram", ["study_name"])
    op.create_table(
        "orch_concurrency_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=True),
        sa.Column("gpu_name", sa.String(255), nullable=False),
        sa.Column("from_slots", sa.Integer, nullable=False),
        sa.Column("to_slots", sa.Integer, nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text, nullable=True),
    )
    op.create_index(
        "ix_orch_concurrency_events_study_name", "orch_concurrency_events", ["study_name"]
    )
    op.create_table(
        "orch_memory_models",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("adapter", sa.String(255), nullable=False),
        sa.Column("gpu_name", sa.String(255), nullable=False),
        sa.Column("model_overhead_mb", sa.Float, nullable=False),
        sa.Column("per_sample_mb", sa.Float, nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("measured_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("adapter", "gpu_name", name="uq_orch_memory_models_adapter_gpu"),
    )
    op.create_table(
        "orch_batch_limits",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("gpu_name", sa.String(255), nullable=False),
        sa.Column("max_batch_size", sa.Integer, nullable=False),
        sa.Column("trial_number", sa.Integer, nullable=True),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("study_name", "gpu_name", name="uq_orch_batch_limits_study_gpu"),
    )


def downgrade() -> None:
    op.drop_table("orch_batch_limits")
    op.drop_table("orch_memory_models")
    op.drop_index("ix_orch_concurrency_events_study_name", "orch_concurrency_events")
    op.drop_table("orch_concurrency_events")
    op.drop_index("ix_orch_trial_vram_study_name", "orch_trial_vram")
    op.drop_table("orch_trial_vram")
    op.drop_index("ix_orch_workers_study_name", "orch_workers")
    op.drop_table("orch_workers")
