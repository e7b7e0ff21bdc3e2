"""Run operations, shared by the REST routes and the agent tools."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Connection,
    Row,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    func,
    null,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.types import NullType

from rlctl.service.auth.scopes import Scope, allows
from rlctl.service.context import AppContext
from rlctl.service.db.json_sql import json_array_agg, json_object, json_value
from rlctl.service.db.models import Run, RunProcess, StatusCheck
from rlctl.service.db.plans import Read, ReadPlan, run_plan_on
from rlctl.service.db.rows import load_row
from rlctl.service.db.types import utc_value, utcnow
from rlctl.service.environments import run_config
from rlctl.service.environments import service as environments
from rlctl.service.errors import (
    BackendUnavailable,
    InvalidState,
    RateLimited,
    ResourcesExceedCapacity,
    RunNotFound,
    ValidationFailed,
)
from rlctl.service.names import validate_name
from rlctl.service.observability import actor_var, caller_scopes_var
from rlctl.service.pagination import (
    DEFAULT_PAGE,
    decode_cursor,
    encode_cursor,
    newest_first_statement,
    page_parameters,
)
from rlctl.service.runs import admission, archive, continuation, lifecycle, metrics, mixture, ratelimit
from rlctl.service.runs import datasets as dataset_runs
from rlctl.service.runs.launch import Ports
from rlctl.service.runs.manager import RunManager, process_record
from rlctl.service.runs.paths import ROLES, RunPaths, file_version
from rlctl.service.runs.record_bodies import RecordBodies
from rlctl.service.runs.resources import resolve_resources
from rlctl.service.runs.schemas import (
    CheckpointPins,
    CreateRunRequest,
    DatasetMode,
    HeadlineMetrics,
    LiveProcess,
    ProcessOut,
    PromptSplit,
    ResumeRunRequest,
    RunList,
    RunMetrics,
    RunOut,
    RunPrompt,
    RunPrompts,
    RunResults,
    RunSnapshot,
    RunStatusOut,
    RunSummary,
)
from rlctl.service.runs.tool_judge import managed_judge
from rlctl.service.runs.wandb import WandbMode, WandbPlan, offline_requested, plan_wandb, probe_wandb
from rlctl.service.schemas import shown_roots
from rlctl.service.settings import Backend
from rlctl.service.states import ProcessStatus, RunStatus
from rlctl.supervisor.executor import Executor, Resources
from rlctl.supervisor.ports import free_ports
from rlctl.supervisor.process import Liveness
from rlctl.trainer import retention

LIVE_STATUS = {
    Liveness.ALIVE: ProcessStatus.RUNNING,
    Liveness.DEAD: ProcessStatus.EXITED,
    Liveness.UNKNOWN: ProcessStatus.UNKNOWN,
}
RUN_COLUMNS = Run.__table__.c
PROCESS_KEYS = tuple(ProcessOut.model_fields)
PROCESS_COLUMNS = RunProcess.__table__.c


# A run's record (GET /runs/{id}), built once, the run id a bound parameter: one row, the run's columns and its
# processes (ProcessOut's fields) as one JSON array. A join would repeat the run's columns per process, and the
# driver would decode its JSON columns, the config's kilobytes among them, once per process.
_PROCESSES_JSON = (
    select(json_array_agg({key: json_value(PROCESS_COLUMNS[key]) for key in ("id", *PROCESS_KEYS)}))
    .where(PROCESS_COLUMNS.run_id == RUN_COLUMNS.id)
    .scalar_subquery()
)
# Its JSON columns come as their text (decoded by `_record_of`): a row is then plain values, which the route's
# bodies are kept by (record_bodies.py).
_JSON_COLUMNS = tuple(column.key for column in RUN_COLUMNS if isinstance(column.type, JSON))
_RUN_RECORD = select(
    *(cast(column, Text).label(column.key) if column.key in _JSON_COLUMNS else column for column in RUN_COLUMNS),
    _PROCESSES_JSON.label("processes_json"),
).where(RUN_COLUMNS.id == bindparam("run_id"))
_record_bodies = RecordBodies()
# A run's columns by name: its ORM object, a row of its table, or such a row with its JSON decoded (`_record_of`).
RunFields = Run | Row[Any] | SimpleNamespace
HEADLINE_METRICS = {
    "reward_mean": "reward/mean",
    "percent_correct": "train/percent_correct",
    "eval_percent_correct": "eval/percent_correct",
    "loss": "train/loss",
}


# --- create ---


def create_run(ctx: AppContext, manager: RunManager, request: CreateRunRequest) -> tuple[RunOut, bool]:
    """Validate, record (before anything is spawned), then launch. Returns (run, created)."""
    request_hash = _request_hash(request)
    key = request.idempotency_key
    if key is not None and (existing := _run_by_idempotency_key(ctx, key, request_hash)) is not None:
        return existing, False
    chosen = environments.resolve_backend(ctx, request.backend or request.config.get("backend"))
    require_backend(ctx, chosen)
    members = mixture.plan_members(ctx, request.environments, request.config, chosen) if request.environments else []
    if request.dataset is not None:
        dataset_runs.check_sft(request.dataset, chosen, request.config)
    plan = (
        members[0].plan
        if members
        else environments.plan_run_config(ctx, _environment_name(request), request.config, chosen)
    )
    resources = requested_resources(manager.executor, request, chosen)
    start = continuation.warm_start(ctx, request.init_from, plan.backend) if request.init_from else None
    paths = RunPaths(ctx.settings.data_path, new_run_id())
    wandb_plan = _wandb_plan(ctx)
    ports = Ports(*free_ports(2))
    config = _merged_config(ctx, request, plan, paths, ports, wandb_plan.mode != WandbMode.DISABLED)
    if start is not None:
        try:
            continuation.apply_warm_start(config, start)
        except Exception:
            shutil.rmtree(paths.run_dir, ignore_errors=True)  # a dataset split written for a run never recorded
            raise
    if members:
        placement = run_config.RunPlacement(ports.api, ports.inference, str(paths.run_dir))
        enabled = wandb_plan.mode != WandbMode.DISABLED
        config[mixture.MIXTURE_KEY] = mixture.mixture_section(ctx, members, config, placement, enabled)
    run = _new_run(manager, request, plan, paths, ports, config, wandb_plan)
    run.request_hash, run.resources = request_hash, resources.to_dict()
    try:
        with ctx.db.session() as session:
            session.add(run)
    except IntegrityError:
        shutil.rmtree(paths.run_dir, ignore_errors=True)  # a dataset split written for a run never recorded
        existing = _run_by_idempotency_key(ctx, key, request_hash) if key else None
        if existing is None:
            raise
        return existing, False  # a concurrent request with the same key won
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(run_config.render_yaml(config))
    mixture.write_member_configs(config, paths.run_dir)
    manager.admit()  # the new `pending` run starts now or waits in the queue
    return get_run(ctx, run.id), True


def _wandb_plan(ctx: AppContext) -> WandbPlan:
    offline = offline_requested()
    probe = None if offline else probe_wandb(ctx.settings)  # bounded by wandb_check_timeout_s
    return plan_wandb(ctx.settings.wandb_api_key is not None, offline, probe)


def _merged_config(
    ctx: AppContext,
    request: CreateRunRequest,
    plan: environments.RunConfigPlan,
    paths: RunPaths,
    ports: Ports,
    wandb_enabled: bool,
) -> dict[str, Any]:
    """The run's merged config. A dataset run's dataset is checked and its split written first, before anything is
    recorded: the run's directory is new, so nothing else lives there to keep when that fails."""
    placement = run_config.RunPlacement(ports.api, ports.inference, str(paths.run_dir))
    if request.dataset is None:
        return plan.merge(ctx, placement, wandb_enabled, managed=managed_judge(ctx, plan))
    try:
        split = dataset_runs.prepare(ctx, request.dataset, plan.values(), paths.run_dir)
    except Exception:
        shutil.rmtree(paths.run_dir, ignore_errors=True)
        raise
    managed = dataset_runs.managed_values(ctx, request.dataset, paths.run_dir)
    merged = plan.merge(ctx, placement, wandb_enabled, managed=managed, total_steps=split.total_steps)
    if request.dataset.mode == DatasetMode.SFT:
        merged["tinker"].update(dataset_runs.SFT_TRAINER)
    return merged


def _new_run(
    manager: RunManager,
    request: CreateRunRequest,
    plan: environments.RunConfigPlan,
    paths: RunPaths,
    ports: Ports,
    config: dict[str, Any],
    wandb_plan: WandbPlan,
) -> Run:
    """The run's row as it is first recorded: pending, owned by this replica."""
    warning = wandb_plan.warning(paths.run_dir)
    return Run(
        id=paths.run_id,
        environment=plan.environment.name,
        dataset_id=request.dataset.id if request.dataset else None,
        dataset_mode=request.dataset.mode.value if request.dataset else None,
        backend=plan.backend,
        status=lifecycle.PENDING,
        config=config,
        config_path=str(paths.config),
        idempotency_key=request.idempotency_key,
        wandb_project=config["tinker"]["wandb_project"],
        wandb_run_name=config["tinker"]["wandb_run_name"],
        wandb=wandb_plan.record(paths.run_dir),
        warnings=[warning] if warning else [],
        ports=ports.to_dict(),
        owner_id=manager.replica_id,
        executor=manager.executor.name,
        priority=request.priority,
        created_by=actor_var.get(),
        environment_hash=environments.source_hash(plan.environment),
        heartbeat_at=utcnow(),
    )


def requested_resources(executor: Executor, request: CreateRunRequest, backend: Backend) -> Resources:
    """The request's resources with the backend's defaults; more than the executor ever has is refused."""
    asked = request.resources
    resources = resolve_resources(
        backend,
        executor.has_gpus(),
        asked.cpus if asked else None,
        asked.gpus if asked else None,
        asked.memory_gb if asked else None,
    )
    refusal = executor.refusal(resources)
    if refusal is not None:
        raise ResourcesExceedCapacity(
            f"the run could never start: {refusal}", {"field": "resources", "resources": resources.to_dict()}
        )
    return resources


def _environment_name(request: CreateRunRequest) -> str:
    if request.dataset is not None:
        return dataset_runs.DATASET_ENVIRONMENTS[request.dataset.mode]
    name = str(request.environment)
    if name in dataset_runs.DATASET_ENVIRONMENTS.values():
        raise ValidationFailed(
            f'{name} trains on a dataset: give `dataset` ({{"id": ..., "mode": ...}}) instead of `environment`',
            {"field": "environment", "value": name},
        )
    return name


def require_backend(ctx: AppContext, backend: Backend) -> None:
    if backend == Backend.TINKER and ctx.settings.tinker_api_key is None:
        raise BackendUnavailable(
            "the tinker backend needs TINKER_API_KEY in the server's environment; "
            "set it, or start the run with backend 'local'",
            {"backend": "tinker", "missing": "TINKER_API_KEY"},
        )


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _request_hash(request: CreateRunRequest) -> str:
    backend = request.backend.value if request.backend else None
    fields: dict[str, Any] = {"environment": request.environment, "config": request.config, "backend": backend}
    if request.environments is not None:  # likewise
        fields["environments"] = [share.model_dump(mode="json") for share in request.environments]
    if request.dataset is not None:  # only then: the hashes of environment runs stay what they were
        fields["dataset"] = request.dataset.model_dump(mode="json")
    if request.resources is not None:  # likewise
        fields["resources"] = request.resources.model_dump(mode="json")
    if request.priority:
        fields["priority"] = request.priority
    if request.init_from is not None:
        fields["init_from"] = request.init_from.model_dump(mode="json")
    canonical = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _run_by_idempotency_key(ctx: AppContext, key: str, request_hash: str) -> RunOut | None:
    with ctx.db.session() as session:
        run = session.scalars(select(Run).where(Run.idempotency_key == key)).one_or_none()
        if run is None:
            return None
        if run.request_hash != request_hash:
            raise ValidationFailed(
                "idempotency_key was already used for a different request",
                {"field": "idempotency_key", "run_id": run.id},
            )
        return run_record(ctx, run, _queue_position(session, run))


# --- read ---


def get_run(ctx: AppContext, run_id: str) -> RunOut:
    return ctx.db.run_plan(run_record_plan(ctx, run_id))


def run_record_plan(ctx: AppContext, run_id: str) -> ReadPlan[RunOut]:
    """A run's record: the run and its processes in one statement, its queue place in a second when queued."""
    row, queue_position = yield from _record_row_plan(run_id)
    return _record_of(ctx, row, queue_position)


def run_record_body_plan(ctx: AppContext, run_id: str) -> ReadPlan[bytes]:
    """GET /runs/{id}'s body: run_record_plan's record as JSON, the one made of the same inputs before when there
    is one (record_bodies.py)."""
    row, queue_position = yield from _record_row_plan(run_id)
    paths = RunPaths(ctx.settings.data_path, row.id)
    split = dataset_runs.split_file(paths.run_dir) if row.dataset_id else None
    inputs = (
        tuple(row),
        queue_position,
        file_version(paths.trainer_state),  # read before the state itself: a body is never older than its key
        split and file_version(split),
        ctx.settings.data_path,
        shown_roots(),
    )
    return _record_bodies.body(inputs, lambda: _record_of(ctx, row, queue_position).model_dump_json().encode())


def _record_row_plan(run_id: str) -> ReadPlan[tuple[Row[Any], int | None]]:
    validate_name(run_id, f"{RunNotFound.subject} id")
    rows = yield Read(_RUN_RECORD, {"run_id": run_id})
    if not rows:
        raise RunNotFound.for_id(run_id)
    queue_position = yield from _queue_position_plan(rows[0])
    return rows[0], queue_position


def _record_of(ctx: AppContext, row: Row[Any], queue_position: int | None) -> RunOut:
    run = SimpleNamespace(**row._asdict())
    for key in _JSON_COLUMNS:
        text = getattr(run, key)
        setattr(run, key, None if text is None else json.loads(text))
    return _run_out(ctx, run, _processes_in_order(row.processes_json), queue_position)


def _processes_in_order(processes_json: str | None) -> list[dict[str, Any]]:
    """`_PROCESSES_JSON`'s processes in the order they were recorded (an aggregate keeps none), without ids."""
    processes = sorted(json.loads(processes_json or "[]"), key=lambda process: process["id"])
    return [{key: process[key] for key in PROCESS_KEYS} for process in processes]


def _queue_position(session: Session | Connection, run: Run | Row[Any]) -> int | None:
    return run_plan_on(session, _queue_position_plan(run))


def _queue_position_plan(run: Run | Row[Any]) -> ReadPlan[int | None]:
    """A queued run's place; no second query for a run in any other state."""
    if run.status != lifecycle.QUEUED:
        return None
    return (yield from admission.queue_positions_plan([run.id])).get(run.id)


def list_runs(
    ctx: AppContext,
    status: RunStatus | None = None,
    environment: str | None = None,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
    dataset_id: str | None = None,
) -> RunList:
    """A page of runs (for the agent tools): the JSON page the route sends, read back into its model."""
    page = ctx.db.run_plan(list_runs_plan(status, environment, limit, cursor, dataset_id))
    return RunList.model_validate_json(page)


def list_runs_plan(
    status: RunStatus | None = None,
    environment: str | None = None,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
    dataset_id: str | None = None,
) -> ReadPlan[bytes]:
    """GET /runs' body: a RunList as JSON, each run's object written by the database (`_summary_json_columns`).
    Newest first, or with `status=queued` the queue in the order it is admitted."""
    given = (("status", status), ("environment", environment), ("dataset_id", dataset_id))
    filters = {name: value for name, value in given if value}
    if status == lifecycle.QUEUED:
        rows = yield from _queue_rows_plan(filters, limit, cursor)
    else:
        statement = _list_statement(tuple(filters), bool(cursor))
        rows = yield Read(statement, page_parameters(limit, cursor) | filters)
    # Each row read once, by position (`_summary_json_columns`' order): a name looked up on SQLAlchemy's Row costs
    # about 0.3 us, and three a row were a fifth of a page's own time on SQLite.
    page = [tuple(row) for row in rows[:limit]]
    # (no query at all when the page has no queued run)
    queued = [run_id for _, _, run_id, status in page if status == lifecycle.QUEUED]
    positions = yield from admission.queue_positions_plan(queued)
    next_cursor = None
    if len(rows) > limit:
        _, created_at, last_id, _ = page[-1]
        next_cursor = encode_cursor(utc_value(created_at), last_id)
    summaries = ",".join(_placed(summary, positions.get(run_id)) for summary, _, run_id, _ in page)
    return f'{{"runs":[{summaries}],"count":{len(page)},"next_cursor":{json.dumps(next_cursor)}}}'.encode()


def _placed(summary: str, queue_position: int | None) -> str:
    """A run's summary, with its place in the queue when it is queued (the database writes null there)."""
    if queue_position is None:
        return summary
    return json.dumps(json.loads(summary) | {"queue_position": queue_position}, separators=(",", ":"))


def _summary_json_columns() -> tuple[Any, ...]:
    """A listing's columns: the run's summary as RunSummary's JSON, written by the database from the summary's
    columns alone (never the config: kilobytes of JSON per run; total_steps is the column copied from it at
    insert), then the raw values the page needs itself (its cursor, the queued runs' places), selected without
    their types so that the driver's values come as they are. list_runs_plan reads them by position."""
    fields = {key: _summary_value(key) for key in RunSummary.model_fields}
    raw = (type_coerce(RUN_COLUMNS[key], NullType()).label(key) for key in ("created_at", "id", "status"))
    return (json_object(fields).label("summary"), *raw)


def _summary_value(key: str) -> ColumnElement[Any]:
    """One RunSummary field in the database's JSON, as the model writes it."""
    if key == "queue_position":
        return null()  # list_runs_plan places the queued runs
    if key == "priority":
        return func.coalesce(RUN_COLUMNS[key], 0)  # rows from before the column had a default
    return json_value(RUN_COLUMNS[key])


@functools.cache
def _list_statement(filters: tuple[str, ...], after_cursor: bool) -> Select[Any]:
    """GET /runs' statement for one combination of filters (columns equal to bound values of their names), built
    once: building and keying a statement on each request cost about as much as running it."""
    query = select(*_summary_json_columns()).where(*(RUN_COLUMNS[name] == bindparam(name) for name in filters))
    return newest_first_statement(query, RUN_COLUMNS, after_cursor)


def _queue_rows_plan(filters: dict[str, Any], limit: int, cursor: str | None) -> ReadPlan[Sequence[Row[Any]]]:
    """`GET /runs?status=queued`: the queue in the order it is admitted (priority, then first come), a page at a
    time (and one row more); the cursor names the last run of the page before (its priority is read back)."""
    query = select(*_summary_json_columns()).where(*(RUN_COLUMNS[name] == value for name, value in filters.items()))
    if cursor:
        created_at, last_id = decode_cursor(cursor)
        last = yield Read(select(Run.priority).where(Run.id == last_id))
        priority = (last[0].priority if last else 0) or 0
        query = query.where(
            or_(
                Run.priority < priority,
                and_(
                    Run.priority == priority,
                    or_(Run.created_at > created_at, and_(Run.created_at == created_at, Run.id > last_id)),
                ),
            )
        )
    return (yield Read(query.order_by(*admission.QUEUE_ORDER).limit(limit + 1)))


def _summary_fields(run: RunFields) -> dict[str, Any]:
    return {
        "id": run.id,
        "environment": run.environment,
        "dataset_id": run.dataset_id,
        "dataset_mode": run.dataset_mode,
        "backend": run.backend,
        "status": run.status,
        "priority": run.priority or 0,
        "last_step": run.last_step,
        "total_steps": run.total_steps,
        "stalled": run.stalled,
        "wandb_run_name": run.wandb_run_name,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
    }


def run_warnings(run: RunFields, state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The control plane's warnings (W&B offline), then the trainer's (parameters the server ignores, ...)."""
    return [*(run.warnings or []), *((state or {}).get("warnings") or [])]


def run_record(ctx: AppContext, run: Run, queue_position: int | None = None) -> RunOut:
    processes = [ProcessOut.model_validate(p, from_attributes=True) for p in run.processes]
    return _run_out(ctx, run, processes, queue_position)


def _run_out(
    ctx: AppContext,
    run: RunFields,
    processes: list[ProcessOut] | list[dict[str, Any]],
    queue_position: int | None,
) -> RunOut:
    """A run's record from its row (an ORM object, or a plain row of its table's columns) and its processes."""
    paths = RunPaths(ctx.settings.data_path, run.id)
    state = paths.read_trainer_state() or {}
    return RunOut(
        **_summary_fields(run),
        queue_position=queue_position,
        resources=run.resources,
        executor=run.executor or "local",
        executor_handle=run.executor_handle,
        created_by=run.created_by,
        environment_hash=run.environment_hash,
        config=run.config,
        config_path=run.config_path,
        wandb_project=run.wandb_project,
        wandb_url=run.wandb_url,
        failure=run.failure,
        weights=run.weights,
        environments=mixture.summary(run.config),
        wandb=run.wandb,
        warnings=run_warnings(run, state),
        collapse=state.get("collapse"),
        dataset=dataset_runs.read_plan(paths.run_dir) if run.dataset_id else None,
        ports=run.ports,
        init_from=continuation.lineage(run.config),
        updated_at=run.updated_at,
        logs=paths.logs(),
        processes=processes,
    )


# --- live status (rate limited) ---


def check_status(ctx: AppContext, run_id: str) -> RunStatusOut:
    """The live check: limited to once per interval per run; an unknown id consumes nothing. A run that has
    ended answers its final, stored state (`live: false`) without using the allowance: nothing is live to read.

    One transaction: the run is read, the check allowed (or counted as limited), the snapshot taken and
    stored. Concurrent checks of a run wait on the winner's row lock, so exactly one is allowed."""
    now = utcnow()
    interval = ctx.settings.status_check_interval_s
    with ctx.db.session() as session:
        run = load_row(session, Run, run_id, RunNotFound)
        if run.status in lifecycle.TERMINAL:
            return RunStatusOut(**dict(_live_snapshot(ctx, session, run, now)), live=False, rate_limited=False)
        stored = RunSummary.model_validate(_summary_fields(run)).model_dump(mode="json") | {"failure": run.failure}
        if not may_check_live():
            return _last_snapshot(session, run_id, now, interval, stored)
        allowance = ratelimit.acquire(session, run_id, now, interval)
        if allowance.allowed:
            snapshot = _live_snapshot(ctx, session, run, now)
            ratelimit.store_snapshot(session, run_id, now, snapshot.model_dump(mode="json"))
    if not allowance.allowed:  # raised once the limited check is counted (committed)
        wait = allowance.retry_after_s
        raise RateLimited(
            f"status of run {run_id} was checked at {allowance.checked_at:%H:%M:%S} UTC; "
            f"the next check is allowed in {wait:.0f} s (one check per {interval:g} s per run)",
            retry_after_s=wait,
            details={
                "rate_limited": True,
                "run_id": run_id,
                "next_check_in_seconds": round(wait, 1),
                "last_checked_at": allowance.checked_at.isoformat(),
                "last_snapshot": allowance.last_snapshot,
                "stored": stored,
            },
        )
    return RunStatusOut(**dict(snapshot), live=True, rate_limited=False, next_check_in_seconds=interval)


def may_check_live() -> bool:
    """A live check spends the run's allowance for everyone: a caller that may operate (or the service itself)
    makes one; a read-only token sees the last snapshot (docs/RUNS.md#rate-limit)."""
    scopes = caller_scopes_var.get()
    return scopes is None or allows([Scope(name) for name in scopes], Scope.OPERATE)


def _last_snapshot(
    session: Session, run_id: str, now: datetime, interval: float, stored: dict[str, Any]
) -> RunStatusOut:
    """The last live check's snapshot (`live: false`), the allowance untouched; a 429 carrying the stored record
    when no check was made yet."""
    row = session.get(StatusCheck, run_id)
    wait = max(0.0, interval - (now - row.checked_at).total_seconds()) if row is not None else 0.0
    if row is None or not row.snapshot:
        raise RateLimited(
            f"run {run_id} has no status snapshot yet: a read-only token sees the last live check's snapshot, "
            "and a token with the operate scope makes the live check",
            retry_after_s=max(wait, 1.0),
            details={
                "rate_limited": True,
                "run_id": run_id,
                "next_check_in_seconds": round(wait, 1),
                "last_checked_at": row.checked_at.isoformat() if row is not None else now.isoformat(),
                "last_snapshot": None,
                "stored": stored,
            },
        )
    return RunStatusOut(**row.snapshot, live=False, rate_limited=False, next_check_in_seconds=round(wait, 1))


def _live_snapshot(ctx: AppContext, session: Session, run: Run, now: datetime) -> RunSnapshot:
    paths = RunPaths(ctx.settings.data_path, run.id)
    latest = metrics.latest_values(session, run.id)
    record = _summary_fields(run)
    running_s = lifecycle.running_seconds(run, now)
    state = paths.read_trainer_state() or {}
    headline = {key: latest[name][1] if name in latest else None for key, name in HEADLINE_METRICS.items()}
    return RunSnapshot(
        **record,
        run_id=run.id,
        wandb_project=run.wandb_project,
        wandb_url=run.wandb_url,
        failure=run.failure,
        checked_at=now,
        processes=[_process_status(RunManager.of(ctx).executor, p) for p in run.processes],
        running_time_seconds=round(running_s, 1),
        running_time_minutes=round(running_s / 60, 2),
        metrics=HeadlineMetrics(step=record["last_step"], **headline),
        latest_metrics={name: value for name, (_step, value) in latest.items()},
        trainer={
            k: state.get(k) for k in ("status", "step", "total_steps", "waiting_for_rollouts_s", "warnings", "collapse")
        },
        logs=paths.logs(),
    )


def _process_status(executor: Executor, process: RunProcess) -> LiveProcess:
    status = ProcessStatus(process.status)
    if status == ProcessStatus.RUNNING and process.pid and process.start_time:
        status = LIVE_STATUS[executor.status(process.run_id, process_record(process, Path(os.devnull)))]
    return LiveProcess(
        role=process.role,
        pid=process.pid,
        status=status,
        exit_code=process.exit_code,
        signal=process.signal,
        log_path=process.log_path,
    )


# --- stop ---


def stop_run(ctx: AppContext, manager: RunManager, run_id: str, wait_s: float = 0.0) -> RunOut:
    with ctx.db.session() as session:
        run = load_row(session, Run, run_id, RunNotFound)
        if run.status in lifecycle.TERMINAL:
            raise InvalidState(f"run {run_id} is already {run.status}", {"run_id": run_id, "status": run.status})
    manager.request_stop(run_id)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not is_terminal(ctx, run_id):
        time.sleep(0.2)
    return get_run(ctx, run_id)


def resume_run(ctx: AppContext, manager: RunManager, run_id: str, request: ResumeRunRequest) -> RunOut:
    """Continue a stopped or failed run from its checkpoint (docs/RUNS.md#resume-and-warm-start): same id, its
    history kept up to that step; admission starts it like a new run."""
    continuation.reopen(ctx, manager.replica_id, run_id, request.step)
    manager.admit()
    return get_run(ctx, run_id)


def _existing_run_paths(ctx: AppContext, run_id: str) -> RunPaths:
    """The paths of a run that exists: a malformed or unknown id is RUN_NOT_FOUND before any file is touched."""
    validate_name(run_id, f"{RunNotFound.subject} id")
    with ctx.db.read() as session:
        load_row(session, Run, run_id, RunNotFound)
    return RunPaths(ctx.settings.data_path, run_id)


def checkpoint_archive(ctx: AppContext, run_id: str, step: int) -> tuple[str, list[Path]]:
    """What GET /runs/{id}/checkpoints/{step}/archive streams: checked here, before any byte is sent."""
    return archive.checkpoint_files(_existing_run_paths(ctx, run_id), step)


def pin_checkpoint(ctx: AppContext, run_id: str, step: int, pinned: bool) -> CheckpointPins:
    """Pin (or unpin) a checkpoint against the run's retention (docs/TRAINER.md#retention). Pinning needs the
    checkpoint; unpinning one that is not pinned changes nothing."""
    paths = _existing_run_paths(ctx, run_id)
    steps = retention.pinned_steps(paths.run_dir)
    if pinned:
        continuation.checkpoint_of(paths, step)
        steps.add(step)
    else:
        steps.discard(step)
    retention.write_pinned(paths.run_dir, steps)
    return CheckpointPins(run_id=run_id, pinned=sorted(steps))


# --- results, metrics, logs ---


def get_results(ctx: AppContext, run_id: str) -> RunResults:
    paths = RunPaths(ctx.settings.data_path, run_id)
    with ctx.db.read() as session:
        run = load_row(session, Run, run_id, RunNotFound)
        latest = metrics.latest_values(session, run_id)
        series = metrics.history(session, run_id)
        record = _summary_fields(run)
        weights, failure, wandb = run.weights, run.failure, (run.wandb_project, run.wandb_url)
    state = paths.read_trainer_state() or {}
    return RunResults(
        **record,
        run_id=run_id,
        final_step=record["last_step"],
        final_metrics={name: value for name, (_step, value) in latest.items()},
        history=series,
        checkpoints=state.get("checkpoints") or [],
        weights=state.get("weights") or weights,
        best_checkpoint=state.get("best_checkpoint"),
        collapse=state.get("collapse"),
        wandb_project=wandb[0],
        wandb_url=wandb[1],
        failure=failure,
    )


def get_prompts(ctx: AppContext, run_id: str, split: PromptSplit, offset: int, limit: int) -> RunPrompts:
    with ctx.db.session() as session:
        load_row(session, Run, run_id, RunNotFound)
    run_dir = RunPaths(ctx.settings.data_path, run_id).run_dir
    prompts, total = dataset_runs.read_prompts(run_dir, split, offset, limit)
    return RunPrompts(
        run_id=run_id,
        split=split,
        prompts=[RunPrompt.model_validate(prompt) for prompt in prompts],
        total=total,
        offset=offset,
    )


def get_metrics(
    ctx: AppContext,
    run_id: str,
    names: list[str] | None = None,
    min_step: int | None = None,
    max_step: int | None = None,
) -> RunMetrics:
    with ctx.db.read() as session:
        load_row(session, Run, run_id, RunNotFound)
        return RunMetrics(run_id=run_id, metrics=metrics.history(session, run_id, names, min_step, max_step))


def log_path(ctx: AppContext, run_id: str, role: str) -> RunPaths:
    if role not in ROLES:
        raise ValidationFailed(f"unknown process {role!r}", {"field": "process", "available": list(ROLES)})
    with ctx.db.read() as session:
        load_row(session, Run, run_id, RunNotFound)
    return RunPaths(ctx.settings.data_path, run_id)


def log_tail(ctx: AppContext, run_id: str, role: str, lines: int) -> str:
    paths = log_path(ctx, run_id, role)
    tail = RunManager.of(ctx).executor.logs(run_id, role, paths.log(role), lines)
    return "".join(ctx.scrub(line) + "\n" for line in tail)


def is_terminal(ctx: AppContext, run_id: str) -> bool:
    with ctx.db.read() as session:
        status = session.scalar(select(Run.status).where(Run.id == run_id))
    if status is None:
        raise RunNotFound.for_id(run_id)
    return status in lifecycle.TERMINAL
