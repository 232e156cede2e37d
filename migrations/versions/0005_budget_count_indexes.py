"""Indexes for the budget count: a study's last trial number, its trials by state, its re-runs

Every trial start of a study counts the study's budget under the budget lock, which every other
start of the study waits on, so the count must not grow with the study. With these indexes each
part of it reads only what it needs: the last trial number (the number of trials, numbers run
0, 1, 2, ... without gaps) is one index probe on (study_id, number); the waiting and failed
trials are a range of (study_id, state); the re-runs are the few `retry_history` attributes.
Without them each start read every trial of the study (about 10,000 rows at 10,000 trials).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

RETRY_HISTORY = sa.text("key = 'retry_history'")


def upgrade() -> None:
    op.create_index("ix_orch_trials_study_number", "trials", ["study_id", "number"])
    op.create_index("ix_orch_trials_study_state", "trials", ["study_id", "state"])
    op.create_index(
        "ix_orch_trial_system_attributes_retry",
        "trial_system_attributes",
        ["trial_id"],
        postgresql_where=RETRY_HISTORY,
        sqlite_where=RETRY_HISTORY,
    )


def downgrade() -> None:
    op.drop_index("ix_orch_trial_system_attributes_retry", "trial_system_attributes")
    op.drop_index("ix_orch_trials_study_state", "trials")
    op.drop_index("ix_orch_trials_study_number", "trials")
