"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 04:47:54.428553
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("progress_done", sa.Integer(), nullable=False),
        sa.Column("progress_total", sa.Integer(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("owner_id", sa.String(length=64), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_kind"), ["kind"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("environment", sa.String(length=128), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_path", sa.String(length=1024), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("wandb_project", sa.String(length=256), nullable=True),
        sa.Column("wandb_run_name", sa.String(length=256), nullable=True),
        sa.Column("wandb_url", sa.String(length=1024), nullable=True),
        sa.Column("failure", sa.JSON(), nullable=True),
        sa.Column("stalled", sa.Boolean(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("weights", sa.String(length=1024), nullable=True),
        sa.Column("ports", sa.JSON(), nullable=False),
        sa.Column("owner_id", sa.String(length=64), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_runs_idempotency_key")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_environment"), ["environment"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index("ix_runs_status_created_at_id", ["status", "created_at", "id"], unique=False)

    op.create_table(
        "tool_sessions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("selected_environment", sa.String(length=128), nullable=True),
        sa.Column("pending_config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_sessions")),
    )
    op.create_table(
        "run_metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_metrics_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_metrics")),
        sa.UniqueConstraint("run_id", "name", "step", name="uq_run_metrics_run_id_name_step"),
    )
    with op.batch_alter_table("run_metrics", schema=None) as batch_op:
        batch_op.create_index("ix_run_metrics_run_id_step", ["run_id", "step"], unique=False)

    op.create_table(
        "run_processes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("start_time", sa.Float(), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("log_path", sa.String(length=1024), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_processes_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_processes")),
        sa.UniqueConstraint("run_id", "role", name="uq_run_processes_run_id_role"),
    )
    with op.batch_alter_table("run_processes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_processes_run_id"), ["run_id"], unique=False)

    op.create_table(
        "status_checks",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("checks_allowed", sa.Integer(), nullable=False),
        sa.Column("checks_limited", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_status_checks_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_status_checks")),
    )


def downgrade() -> None:
    op.drop_table("status_checks")
    with op.batch_alter_table("run_processes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_processes_run_id"))

    op.drop_table("run_processes")
    with op.batch_alter_table("run_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_run_metrics_run_id_step")

    op.drop_table("run_metrics")
    op.drop_table("tool_sessions")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_status_created_at_id")
        batch_op.drop_index(batch_op.f("ix_runs_owner_id"))
        batch_op.drop_index(batch_op.f("ix_runs_environment"))
        batch_op.drop_index("ix_runs_created_at_id")

    op.drop_table("runs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_jobs_kind"))
        batch_op.drop_index("ix_jobs_created_at_id")

    op.drop_table("jobs")
