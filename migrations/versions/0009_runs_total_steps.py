"""runs.total_steps: the run's step count as a column, so a listing never parses a run's config

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("total_steps", sa.Integer(), nullable=True))
    # Existing runs: the value their stored config holds (the service sets it at insert from now on).
    runs = sa.table("runs", sa.column("config", sa.JSON()), sa.column("total_steps", sa.Integer()))
    op.execute(runs.update().values(total_steps=runs.c.config[("tinker", "total_steps")].as_integer()))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("total_steps")
