"""runs trained on a trajectory dataset: the dataset and the mode on the run (lineage)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 05:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dataset_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("dataset_mode", sa.String(length=16), nullable=True))
        batch_op.create_index(batch_op.f("ix_runs_dataset_id"), ["dataset_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_dataset_id"))
        batch_op.drop_column("dataset_mode")
        batch_op.drop_column("dataset_id")
