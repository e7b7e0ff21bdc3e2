"""trajectory datasets and collections

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("parent_id", sa.String(length=32), nullable=True),
        sa.Column("operation", sa.String(length=32), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("source_format", sa.String(length=32), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("record_count", sa.Integer(), nullable=False),
        sa.Column("byte_size", sa.BigInteger(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index("ix_datasets_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_datasets_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_datasets_parent_id"), ["parent_id"], unique=False)

    op.create_table(
        "collections",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("prompt_count", sa.Integer(), nullable=False),
        sa.Column("runs_per_prompt", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("dataset_id", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collections")),
    )
    with op.batch_alter_table("collections", schema=None) as batch_op:
        batch_op.create_index("ix_collections_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_collections_status"), ["status"], unique=False)

    op.create_table(
        "collection_items",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("collection_id", sa.String(length=32), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=False),
        sa.Column("run_index", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("api_calls", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("has_reasoning", sa.Boolean(), nullable=False),
        sa.Column("completed", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["collection_id"],
            ["collections.id"],
            name=op.f("fk_collection_items_collection_id_collections"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collection_items")),
        sa.UniqueConstraint("collection_id", "prompt_index", "run_index", name="uq_collection_items_item"),
    )
    with op.batch_alter_table("collection_items", schema=None) as batch_op:
        batch_op.create_index("ix_collection_items_collection_id_status", ["collection_id", "status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("collection_items", schema=None) as batch_op:
        batch_op.drop_index("ix_collection_items_collection_id_status")
    op.drop_table("collection_items")
    with op.batch_alter_table("collections", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_collections_status"))
        batch_op.drop_index("ix_collections_created_at_id")
    op.drop_table("collections")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_parent_id"))
        batch_op.drop_index(batch_op.f("ix_datasets_name"))
        batch_op.drop_index("ix_datasets_created_at_id")
    op.drop_table("datasets")
