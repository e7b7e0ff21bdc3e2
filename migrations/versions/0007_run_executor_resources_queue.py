"""runs: executor and its handle, resources, priority; the admission lock row (docs/RUNS.md#admission)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 09:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("executor", sa.String(length=16), server_default="local", nullable=False))
        batch_op.add_column(sa.Column("executor_handle", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("resources", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
    admission = op.create_table(
        "run_admission",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_admission")),
    )
    op.bulk_insert(admission, [{"id": 1, "generation": 0}])


def downgrade() -> None:
    op.drop_table("run_admission")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("priority")
        batch_op.drop_column("resources")
        batch_op.drop_column("executor_handle")
        batch_op.drop_column("executor")
