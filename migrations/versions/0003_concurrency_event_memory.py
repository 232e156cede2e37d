"""orch_concurrency_events: the memory a GPU's trials may hold at once, before and after

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orch_concurrency_events") as table:
        table.add_column(sa.Column("from_mb", sa.Float, nullable=True))
        table.add_column(sa.Column("to_mb", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("orch_concurrency_events") as table:
        table.drop_column("to_mb")
        table.drop_column("from_mb")
