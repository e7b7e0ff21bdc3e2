"""runs: how the run reaches W&B, and the warnings the control plane recorded

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 05:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wandb", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("warnings", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("warnings")
        batch_op.drop_column("wandb")
