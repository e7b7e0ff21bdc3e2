"""runs listing indexes: the environment filter in keyset order

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 06:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # GET /runs?environment=X pages newest first: one index walk from the cursor, instead of every run of X
    # sorted. It replaces the index on environment alone, which it covers.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_environment_created_at_id", ["environment", "created_at", "id"], unique=False)
        batch_op.drop_index("ix_runs_environment")


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_environment", ["environment"], unique=False)
        batch_op.drop_index("ix_runs_environment_created_at_id")
