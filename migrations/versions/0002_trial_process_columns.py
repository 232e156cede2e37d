"""orch_trial_vram: the trial process's pid and how long its ask waited for and held the budget lock

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orch_trial_vram") as table:
        table.add_column(sa.Column("pid", sa.Integer, nullable=True))
        table.add_column(sa.Column("ask_wait_ms", sa.Float, nullable=True))
        table.add_column(sa.Column("ask_held_ms", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("orch_trial_vram") as table:
        table.drop_column("ask_held_ms")
        table.drop_column("ask_wait_ms")
        table.drop_column("pid")
