"""The schema. Alembic migrations in `migrations/` create it; keep both in step."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from rlctl.service.db.types import UTCDateTime, utcnow

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


def _config_total_steps(context: Any) -> int | None:
    """A new run's total_steps column: its config's `tinker.total_steps` (the config never changes after)."""
    config = context.get_current_parameters().get("config") or {}
    steps = (config.get("tinker") or {}).get("total_steps") if isinstance(config, dict) else None
    return steps if isinstance(steps, int) else None


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    environment: Mapped[str] = mapped_column(String(128))
    # The dataset a run trains on (docs/RUNS.md#training-on-a-dataset); kept when the dataset is deleted.
    dataset_id: Mapped[str | None] = mapped_column(String(32), index=True)
    dataset_mode: Mapped[str | None] = mapped_column(String(16))  # offline | online
    backend: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    config_path: Mapped[str | None] = mapped_column(String(1024))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    wandb_project: Mapped[str | None] = mapped_column(String(256))
    wandb_run_name: Mapped[str | None] = mapped_column(String(256))
    wandb_url: Mapped[str | None] = mapped_column(String(1024))
    failure: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # How the run reaches W&B ({mode, reason, offline_dir, sync_command}: docs/RUNS.md#wb-mirror).
    wandb: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    warnings: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # the control plane's, e.g. W&B offline
    stalled: Mapped[bool] = mapped_column(Boolean, default=False)
    last_step: Mapped[int | None] = mapped_column(Integer)
    # A copy of config.tinker.total_steps, set at insert: GET /runs shows it without loading any config.
    total_steps: Mapped[int | None] = mapped_column(Integer, default=_config_total_steps)
    weights: Mapped[str | None] = mapped_column(String(1024))
    ports: Mapped[dict[str, Any]] = mapped_column(default=dict)
    owner_id: Mapped[str | None] = mapped_column(String(64), index=True)
    created_by: Mapped[str | None] = mapped_column(String(128))  # the name of the token that created it
    environment_hash: Mapped[str | None] = mapped_column(String(64))  # SHA-256 of the environment's source
    heartbeat_at: Mapped[datetime | None]
    # Where the run's processes live (docs/RUNS.md#executors): the executor's name and its handle of the run
    # (a Ray submission id; null for the local executor, whose processes are the run_processes rows).
    executor: Mapped[str] = mapped_column(String(16), default="local", server_default="local")
    executor_handle: Mapped[str | None] = mapped_column(String(128))
    resources: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {cpus, gpus, memory_gb}
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # higher is admitted first
    # SHA-256 of the secret a run on Ray authenticates its node's calls with (docs/RAY.md#authentication).
    node_secret_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]

    processes: Mapped[list[RunProcess]] = relationship(
        back_populates="run", cascade="all, delete-orphan", order_by="RunProcess.id"
    )

    # Keyset order (newest first), and each filter of GET /runs followed by that order.
    __table_args__ = (
        Index("ix_runs_created_at_id", "created_at", "id"),
        Index("ix_runs_status_created_at_id", "status", "created_at", "id"),
        Index("ix_runs_environment_created_at_id", "environment", "created_at", "id"),
    )


class RunProcess(Base):
    """One supervised process of a run: enough to recognise it again after a service restart."""

    __tablename__ = "run_processes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    pid: Mapped[int | None] = mapped_column(Integer)
    pgid: Mapped[int | None] = mapped_column(Integer)
    start_time: Mapped[float | None] = mapped_column(Float)
    port: Mapped[int | None] = mapped_column(Integer)
    log_path: Mapped[str | None] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]

    run: Mapped[Run] = relationship(back_populates="processes")

    __table_args__ = (UniqueConstraint("run_id", "role", name="uq_run_processes_run_id_role"),)


class RunAdmission(Base):
    """One row (id 1): every admission decision first updates it, so decisions run one at a time on SQLite (the
    write lock) and PostgreSQL (the row lock) alike, and each sees the one before it (docs/RUNS.md#admission)."""

    __tablename__ = "run_admission"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    generation: Mapped[int] = mapped_column(Integer)


class RunMetric(Base):
    __tablename__ = "run_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("run_id", "name", "step", name="uq_run_metrics_run_id_name_step"),
        Index("ix_run_metrics_run_id_step", "run_id", "step"),
    )


class StatusCheck(Base):
    """The last live status check of a run: the rate limit is a compare-and-set on `checked_at`."""

    __tablename__ = "status_checks"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    checked_at: Mapped[datetime]
    snapshot: Mapped[dict[str, Any]] = mapped_column(default=dict)
    checks_allowed: Mapped[int] = mapped_column(Integer, default=0)
    checks_limited: Mapped[int] = mapped_column(Integer, default=0)


class ToolSession(Base):
    """An agent's tool session: its selected environment and pending config."""

    __tablename__ = "tool_sessions"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    selected_environment: Mapped[str | None] = mapped_column(String(128))
    pending_config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Job(Base):
    """A long operation run in the background (dataset operations, inference tests, collections)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int | None] = mapped_column(Integer)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    owner_id: Mapped[str | None] = mapped_column(String(64))
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_jobs_created_at_id", "created_at", "id"),)


# --- trajectory datasets and collections (migration 0002) ---


class Dataset(Base):
    """An immutable set of trajectory records; the records live in `datasets/{id}/` under the data dir."""

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    parent_id: Mapped[str | None] = mapped_column(String(32), index=True)  # lineage survives the parent's deletion
    operation: Mapped[str] = mapped_column(String(32))  # upload, filter, compress, score, collect
    parameters: Mapped[dict[str, Any]] = mapped_column(default=dict)
    source_format: Mapped[str | None] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="ready")
    record_count: Mapped[int] = mapped_column(Integer, default=0)
    byte_size: Mapped[int] = mapped_column(BigInteger, default=0)
    stats: Mapped[dict[str, Any]] = mapped_column(default=dict)
    report: Mapped[dict[str, Any]] = mapped_column(default=dict)  # what the operation did (skipped, dropped, ...)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_datasets_created_at_id", "created_at", "id"),)


class Collection(Base):
    """A batch run of an agent over prompts; its items say exactly which (prompt, run) pairs are done."""

    __tablename__ = "collections"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)  # never a key: keys come from settings
    prompt_count: Mapped[int] = mapped_column(Integer)
    runs_per_prompt: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(32))
    dataset_id: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_collections_created_at_id", "created_at", "id"),)


class CollectionItem(Base):
    """The outcome of one (prompt index, run index) pair: kept, discarded or failed."""

    __tablename__ = "collection_items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    collection_id: Mapped[str] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    prompt_index: Mapped[int] = mapped_column(Integer)
    run_index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    api_calls: Mapped[int] = mapped_column(Integer, default=0)
    tool_calls: Mapped[int] = mapped_column(Integer, default=0)
    has_reasoning: Mapped[bool] = mapped_column(Boolean, default=False)
    completed: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    finished_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("collection_id", "prompt_index", "run_index", name="uq_collection_items_item"),
        Index("ix_collection_items_collection_id_status", "collection_id", "status"),
    )


# --- the judge's cache (migration 0008) ---


class JudgeCacheEntry(Base):
    """A judge's verdicts on one group, by content: the same model, rubric and group contents are never judged
    twice (docs/TRAJECTORIES.md#judge). Scores and short reasons only: never a key, never the trajectories."""

    __tablename__ = "judge_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # rlctl/trajectories/judge.py cache_key
    model: Mapped[str] = mapped_column(String(256))
    verdicts: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{score, reason}] in group order
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
