"""orch_workers: the Slurm job, node and restart count a worker ran under (all NULL outside Slurm)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orch_workers") as table:
        table.add_column(sa.Column("slurm_job", sa.String(64), nullable=True))
        table.add_column(sa.Column("slurm_node", sa.String(255), nullable=True))
        table.add_column(sa.Column("slurm_restarts", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("orch_workers") as table:
        table.drop_column("slurm_restarts")
        table.drop_column("slurm_node")
        table.drop_column("slurm_job")
