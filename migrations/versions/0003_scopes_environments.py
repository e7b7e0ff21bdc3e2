"""runs name the token that created them and the hash of their environment's source

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 05:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("created_by", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("environment_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("environment_hash")
        batch_op.drop_column("created_by")
