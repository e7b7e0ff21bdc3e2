"""runs: the hash of the secret a run on Ray authenticates its node's reports with (docs/RAY.md#authentication)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node_secret_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("node_secret_hash")
