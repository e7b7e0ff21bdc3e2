"""judge_cache: a judge's verdicts on a group of trajectories, by content

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judge_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("verdicts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_judge_cache")),
    )


def downgrade() -> None:
    op.drop_table("judge_cache")
