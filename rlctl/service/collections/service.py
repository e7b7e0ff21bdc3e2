"""Collection operations, shared by the REST routes and the agent tools."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rlctl.sandbox import errors as sandbox_errors
from rlctl.sandbox.bubblewrap import Sandbox, require_sandbox
from rlctl.sandbox.netgate import NetworkPolicy, parse_allowed_ranges, parse_destination
from rlctl.service.collections.schemas import (
    ENDED,
    CheckpointModel,
    CollectionItemOut,
    CollectionItemsPage,
    CollectionList,
    CollectionOut,
    CollectionProgress,
    CollectionStatus,
    CreateCollectionRequest,
    ItemStatus,
)
from rlctl.service.context import AppContext
from rlctl.service.datasets.builder import new_dataset_id
from rlctl.service.datasets.errors import CollectionNotFound, SandboxUnavailable
from rlctl.service.datasets.store import write_json_atomically
from rlctl.service.db.models import Collection, CollectionItem, Job
from rlctl.service.db.rows import load_row
from rlctl.service.db.types import utcnow
from rlctl.service.errors import InvalidState, ValidationFailed
from rlctl.service.jobs.runner import TERMINAL, UNFINISHED, JobRunner
from rlctl.service.jobs.service import job_record
from rlctl.service.observability import scrub_json
from rlctl.service.pagination import DEFAULT_PAGE, newest_first_page
from rlctl.service.runs.checkpoints import run_checkpoints, served_model_id
from rlctl.service.schemas import CheckpointRef
from rlctl.service.settings import Backend
from rlctl.service.states import JobStatus

JOB_KIND = "collection_run"
KEPT, DISCARDED, FAILED = ItemStatus.KEPT, ItemStatus.DISCARDED, ItemStatus.FAILED
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
DONE_STATUSES = (KEPT, DISCARDED)  # a resume skips these; failed items are tried again


class NetworkDestinationForbidden(ValidationFailed):
    """A destination the server does not let collections name (a non-public address outside the allowed ranges,
    a cloud metadata address or name)."""

    code = "NETWORK_DESTINATION_FORBIDDEN"


def network_policy(ctx: AppContext, destinations: list[str]) -> NetworkPolicy | None:
    """What a collection's sandbox may reach (None: nothing), with the ranges the server allows today."""
    if not destinations:
        return None
    allowed = parse_allowed_ranges(ctx.settings.sandbox_network_allow)
    return NetworkPolicy(tuple(parse_destination(d) for d in destinations), allowed)


def require_terminal_sandbox(bwrap: str, sandbox_uid: int, network: bool = False) -> Sandbox:
    """The sandbox `terminal` runs in; where none can be made, 409 SANDBOX_UNAVAILABLE (the wing's reason)."""
    try:
        return require_sandbox(bwrap, sandbox_uid, network)
    except sandbox_errors.NetworkUnavailable as error:
        raise SandboxUnavailable(str(error), {"tool": "terminal"}) from None
    except sandbox_errors.SandboxUnavailable as error:
        message = f"the terminal tool needs a sandbox and none can be made here: {error}"
        raise SandboxUnavailable(message, {"tool": "terminal"}) from None


def collection_dir(ctx: AppContext, collection_id: str) -> Path:
    return ctx.settings.data_path / "collections" / collection_id


def create_collection(ctx: AppContext, request: CreateCollectionRequest) -> CollectionOut:
    """Store the prompts and the collection, then start its job. Returns the collection."""
    policy = network_policy(ctx, request.network)
    for destination in policy.destinations if policy is not None else ():
        if policy is not None and (reason := policy.refusal(destination)) is not None:
            raise NetworkDestinationForbidden(
                f"network destination {destination} is refused: {reason}",
                {"destination": str(destination), "reason": reason},
            )
    if "terminal" in request.tools:  # never run unsandboxed: refused before anything is stored
        require_terminal_sandbox(ctx.settings.sandbox_bwrap, ctx.settings.sandbox_uid, network=bool(request.network))
    checkpoint = _checkpoint(ctx, request.model) if isinstance(request.model, CheckpointModel) else None
    collection_id = "col" + uuid.uuid4().hex[:13]
    directory = collection_dir(ctx, collection_id)
    directory.mkdir(parents=True)
    prompts_path = directory / "prompts.jsonl"
    # No configured secret is kept (a system prompt or a prompt may hold one): the files, the database, the
    # collection's answers and its dataset's parameters get `***`, and so does the model.
    with prompts_path.open("w", encoding="utf-8") as handle:
        for item in request.prompts:
            scrubbed = scrub_json(item.model_dump(exclude_none=True), ctx.scrub)
            handle.write(json.dumps(scrubbed, ensure_ascii=False) + "\n")
    stored = scrub_json(request.model_dump(exclude={"prompts"}), ctx.scrub)
    stored["output_id"] = new_dataset_id()
    stored["tools"] = sorted(set(request.tools))
    if checkpoint is not None:  # the model id its server answers to, and the lineage
        stored["model"] = served_model_id(checkpoint.run_id, checkpoint.step)
        stored["checkpoint"] = checkpoint.model_dump()
    write_json_atomically(directory / "params.json", stored)
    with ctx.db.session() as session:
        session.add(
            Collection(
                id=collection_id,
                name=request.name,
                status=CollectionStatus.QUEUED,
                params=stored,
                prompt_count=len(request.prompts),
                runs_per_prompt=request.runs_per_prompt,
            )
        )
    _start_job(ctx, collection_id)
    return get_collection(ctx, collection_id)


def _checkpoint(ctx: AppContext, model: CheckpointModel) -> CheckpointRef:
    """The run's checkpoint, checked now (a local run, the step there): an error before anything is stored."""
    found = run_checkpoints(ctx, model.run)
    if found.backend != Backend.LOCAL:
        raise ValidationFailed(
            f"run {model.run} is a {found.backend} run: a collection serves local checkpoints only",
            {"field": "model.run", "backend": found.backend},
        )
    step = found.steps([model.step] if model.step is not None else None, "model.step")[0]
    return CheckpointRef(run_id=model.run, step=step)


def get_collection(ctx: AppContext, collection_id: str) -> CollectionOut:
    with ctx.db.session() as session:
        return _collection_record(session, load_row(session, Collection, collection_id, CollectionNotFound))


def list_collections(
    ctx: AppContext, status: CollectionStatus | None = None, limit: int = DEFAULT_PAGE, cursor: str | None = None
) -> CollectionList:
    query = select(Collection)
    if status:
        query = query.where(Collection.status == status)
    with ctx.db.session() as session:

        def record(row: Collection) -> CollectionOut:
            return _collection_record(session, row)

        records, next_cursor = newest_first_page(session, query, Collection, limit, cursor, record)
    return CollectionList(collections=records, count=len(records), next_cursor=next_cursor)


def list_items(
    ctx: AppContext, collection_id: str, status: ItemStatus | None = None, offset: int = 0, limit: int = 100
) -> CollectionItemsPage:
    """Recorded outcomes in (prompt index, run index) order; pairs not yet run are not listed."""
    with ctx.db.session() as session:
        load_row(session, Collection, collection_id, CollectionNotFound)
        query = select(CollectionItem).where(CollectionItem.collection_id == collection_id)
        if status:
            query = query.where(CollectionItem.status == status)
        total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        rows = session.scalars(
            query.order_by(CollectionItem.prompt_index, CollectionItem.run_index).offset(offset).limit(limit)
        ).all()
        items = [CollectionItemOut.model_validate(row, from_attributes=True) for row in rows]
    following = offset + len(items)
    return CollectionItemsPage(
        collection_id=collection_id,
        offset=offset,
        limit=limit,
        total=total,
        next_offset=following if items and following < total else None,
        items=items,
    )


def resume_collection(ctx: AppContext, collection_id: str) -> CollectionOut:
    """A new job that runs every pair not yet kept or discarded (failed ones are tried again)."""
    with ctx.db.session() as session:
        collection = load_row(session, Collection, collection_id, CollectionNotFound)
        status = effective_status(session, collection)
        if status in (CollectionStatus.QUEUED, CollectionStatus.RUNNING, CollectionStatus.COMPLETED):
            raise InvalidState(
                f"collection {collection_id} is {status}; only a cancelled or failed one resumes",
                {"collection_id": collection_id, "status": status},
            )
        collection.status, collection.error, collection.finished_at = CollectionStatus.QUEUED, None, None
    _start_job(ctx, collection_id)
    return get_collection(ctx, collection_id)


def cancel_collection(ctx: AppContext, collection_id: str) -> CollectionOut:
    with ctx.db.session() as session:
        collection = load_row(session, Collection, collection_id, CollectionNotFound)
        job = session.get(Job, collection.job_id) if collection.job_id else None
        if job is None or job.status in TERMINAL:
            details = {"collection_id": collection_id, "status": collection.status}
            raise InvalidState(f"collection {collection_id} is not running", details)
    JobRunner.of(ctx).cancel(job.id)
    if job.status == JobStatus.QUEUED:  # the runner ends a queued job at once; its handler never runs to record it
        mark(ctx, collection_id, status=CollectionStatus.CANCELLED)
    return get_collection(ctx, collection_id)


def chat_api_key(ctx: AppContext, base_url: str) -> str:
    """The key for a collection's endpoint: a configured key only for the hosts allowed to receive it, and only
    over HTTPS on its standard port (plain HTTP only to a loopback address, where it never leaves the machine)."""
    settings = ctx.settings
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    allowed = [h.strip().lower() for h in settings.collection_key_hosts.split(":") if h.strip()]
    secure = parts.scheme == "https" and parts.port in (None, 443)
    if not (secure or host in LOOPBACK_HOSTS):
        return "no-key"
    if any(host == name or host.endswith("." + name) for name in allowed):
        key = settings.collection_api_key or settings.openrouter_api_key
        if key is not None:
            return key.get_secret_value()
    return "no-key"


def _start_job(ctx: AppContext, collection_id: str) -> None:
    with ctx.db.session() as session:
        collection = load_row(session, Collection, collection_id, CollectionNotFound)
        total = collection.prompt_count * collection.runs_per_prompt
    job_id = JobRunner.of(ctx).submit(JOB_KIND, {"collection_id": collection_id}, total=total)
    with ctx.db.session() as session:
        session.get_one(Collection, collection_id).job_id = job_id


def item_counts(session: Session, collection_id: str) -> dict[str, int]:
    rows = session.execute(
        select(CollectionItem.status, func.count())
        .where(CollectionItem.collection_id == collection_id)
        .group_by(CollectionItem.status)
    ).all()
    return {status: count for status, count in rows}


def effective_status(session: Session, collection: Collection) -> CollectionStatus:
    """While its job lives, the job's state (the handler records the outcome a moment before the job ends); after,
    the recorded outcome, or the job's when the handler never ran (a job cancelled while still queued)."""
    job = session.get(Job, collection.job_id) if collection.job_id else None
    if job is None:
        return CollectionStatus(collection.status)
    if job.status in UNFINISHED:
        return CollectionStatus(job.status)
    if collection.status in UNFINISHED:
        return CollectionStatus.COMPLETED if job.status == JobStatus.SUCCEEDED else CollectionStatus(job.status)
    return CollectionStatus(collection.status)


def _collection_record(session: Session, collection: Collection) -> CollectionOut:
    counts = item_counts(session, collection.id)
    total = collection.prompt_count * collection.runs_per_prompt
    progress = {name: counts.get(name, 0) for name in (KEPT, DISCARDED, FAILED)}
    job = session.get(Job, collection.job_id) if collection.job_id else None
    params = {k: v for k, v in collection.params.items() if k != "output_id"}
    return CollectionOut(
        id=collection.id,
        name=collection.name,
        status=effective_status(session, collection),
        model=params.get("model", ""),
        base_url=params.get("base_url"),
        checkpoint=CheckpointRef.model_validate(params["checkpoint"]) if params.get("checkpoint") else None,
        prompt_count=collection.prompt_count,
        runs_per_prompt=collection.runs_per_prompt,
        params=params,
        progress=CollectionProgress(total=total, **progress, pending=total - sum(progress.values())),
        job_id=collection.job_id,
        job=job_record(job) if job is not None else None,
        dataset_id=collection.dataset_id,
        error=collection.error,
        created_at=collection.created_at,
        updated_at=collection.updated_at,
        finished_at=collection.finished_at,
    )


def mark(ctx: AppContext, collection_id: str, **values: Any) -> None:
    if values.get("status") in ENDED:
        values.setdefault("finished_at", utcnow())
    with ctx.db.session() as session:
        collection = session.get(Collection, collection_id)
        if collection is not None:
            for key, value in values.items():
                setattr(collection, key, value)
