"""Dataset operations, shared by the REST routes and the agent tools: each takes the AppContext and its typed
request and returns its response model. Long operations start a background job and return it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import select

from rlctl.service.context import AppContext
from rlctl.service.datasets.builder import DatasetBuilder, new_dataset_id
from rlctl.service.datasets.errors import (
    DatasetBusy,
    DatasetNotFound,
    EmptyUpload,
    ExportNotFound,
    InvalidEncoding,
    InvalidRecords,
    SummarizerNotConfigured,
)
from rlctl.service.datasets.schemas import (
    CompressRequest,
    DatasetList,
    DatasetOut,
    DatasetStatsOut,
    ExportFormat,
    FilterRequest,
    GrpoExportRequest,
    MetricsPage,
    Operation,
    RecordsPage,
    ScoreRequest,
    TrainedRun,
    UploadOptions,
)
from rlctl.service.datasets.store import DatasetStore, read_page
from rlctl.service.datasets.tokenizers import load_counter, resolve_tokenizer, run_tokenizer_dir
from rlctl.service.datasets.uploads import ByteStream, UndecodableUpload, upload_items
from rlctl.service.db.models import Dataset, Job, Run
from rlctl.service.db.rows import load_row
from rlctl.service.errors import PayloadTooLarge, ValidationFailed
from rlctl.service.jobs.runner import UNFINISHED, JobRunner
from rlctl.service.jobs.schemas import JobOut
from rlctl.service.jobs.service import get_job
from rlctl.service.names import validate_name
from rlctl.service.pagination import DEFAULT_PAGE, newest_first_page
from rlctl.service.rewards.errors import JudgeNotConfigured
from rlctl.service.rewards.judge import judge_endpoint
from rlctl.service.rewards.service import check_rewards
from rlctl.trajectories.importing import import_items
from rlctl.trajectories.judge import GROUP_REWARDS, JUDGE_REWARD
from rlctl.trajectories.reading import ItemError, ItemTooLarge
from rlctl.trajectories.records import record_from_dict
from rlctl.trajectories.stats import record_stats_fields

logger = logging.getLogger("rlctl.datasets")

MAX_RECORDS_PAGE = 100
MAX_REPORTED_ERRORS = 100
DATASET_JOB_KINDS = ("dataset_filter", "dataset_compress", "dataset_score", "dataset_export_grpo")


def dataset_store(ctx: AppContext) -> DatasetStore:
    return DatasetStore(ctx.settings.data_path)


def dataset_record(row: Dataset) -> DatasetOut:
    return DatasetOut.model_validate(row, from_attributes=True)


# --- upload ---


class _ErrorList:
    def __init__(self, limit: int = MAX_REPORTED_ERRORS) -> None:
        self.items: list[dict[str, Any]] = []
        self.count = 0
        self.limit = limit

    def add(self, error: ItemError) -> None:
        self.count += 1
        if len(self.items) < self.limit:
            self.items.append({"line": error.line, "code": error.code, "message": error.message, "path": error.path})

    def details(self) -> dict[str, Any]:
        return {"errors": self.items, "error_count": self.count, "errors_truncated": self.count > len(self.items)}


def upload_dataset(ctx: AppContext, options: UploadOptions, lines_or_stream: ByteStream | Iterable[str]) -> DatasetOut:
    """Import an upload, record by record, into a new dataset. With `on_error="fail"` any bad item stores
    nothing (every bad line is reported); with `"skip"` the good items are stored and the bad ones reported."""
    name, fmt, on_error, container = options.name, options.format, options.on_error, options.container
    validate_name(name, "dataset name")
    counter_name = resolve_tokenizer(ctx.settings, options.tokenizer)
    dataset_id = new_dataset_id()
    builder = DatasetBuilder(dataset_store(ctx), f"upload-{dataset_id}", load_counter(ctx.settings, counter_name))
    errors = _ErrorList()
    try:
        for outcome in import_items(upload_items(lines_or_stream, container), fmt):
            if isinstance(outcome, ItemError):
                errors.add(outcome)
            elif not (errors.count and on_error == "fail"):  # after a bad item nothing will be kept: stop writing
                builder.add(outcome.record)
    except UndecodableUpload as error:
        builder.abort()
        raise InvalidEncoding(str(error), {"line": error.line}) from None
    except ItemTooLarge as error:
        builder.abort()
        raise PayloadTooLarge(str(error), {"line": error.line, "limit_bytes": error.limit}) from None
    except BaseException:
        builder.abort()
        raise
    if errors.count and on_error == "fail":
        builder.abort()
        raise InvalidRecords(
            f"{errors.count} item(s) could not be imported; nothing was stored (on_error=skip keeps the good ones)",
            errors.details(),
        )
    if builder.count == 0:
        builder.abort()
        raise EmptyUpload("the upload holds no records", errors.details())
    report = {"records": builder.count, "skipped": errors.count, **errors.details(), "tokenizer": counter_name}
    parameters = {"format": fmt, "on_error": on_error, "container": container, "tokenizer": counter_name}
    meta = builder.finish(
        ctx.db.session,
        dataset_id,
        name=name,
        operation="upload",
        parameters=parameters,
        source_format=fmt,
        report=report,
    )
    return DatasetOut.model_validate(meta)


# --- reads ---


def get_dataset(ctx: AppContext, dataset_id: str) -> DatasetOut:
    with ctx.db.session() as session:
        return dataset_record(load_row(session, Dataset, dataset_id, DatasetNotFound))


def get_dataset_with_lineage(ctx: AppContext, dataset_id: str) -> DatasetOut:
    """The dataset and the runs that trained on it (a run keeps its dataset id when the dataset goes)."""
    with ctx.db.session() as session:
        record = dataset_record(load_row(session, Dataset, dataset_id, DatasetNotFound))
        query = select(Run).where(Run.dataset_id == dataset_id).order_by(Run.created_at.desc(), Run.id.desc())
        runs = [
            TrainedRun(
                id=run.id,
                mode=run.dataset_mode or "offline",
                status=run.status,
                weights=run.weights,
                created_at=run.created_at,
            )
            for run in session.scalars(query)
        ]
    return record.model_copy(update={"runs": runs})


def list_datasets(
    ctx: AppContext,
    name: str | None = None,
    operation: Operation | None = None,
    parent_id: str | None = None,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> DatasetList:
    query = select(Dataset)
    if name:
        query = query.where(Dataset.name == name)
    if operation:
        query = query.where(Dataset.operation == operation)
    if parent_id:
        query = query.where(Dataset.parent_id == parent_id)
    with ctx.db.session() as session:
        records, next_cursor = newest_first_page(session, query, Dataset, limit, cursor, dataset_record)
    return DatasetList(datasets=records, count=len(records), next_cursor=next_cursor)


def dataset_stats(ctx: AppContext, dataset_id: str) -> DatasetStatsOut:
    with ctx.db.session() as session:
        row = load_row(session, Dataset, dataset_id, DatasetNotFound)
        return DatasetStatsOut(dataset_id=row.id, record_count=row.record_count, stats=row.stats)


def read_records(ctx: AppContext, dataset_id: str, offset: int = 0, limit: int = 20) -> RecordsPage:
    """A page of records, found through the offsets index: as fast at the end of a dataset as at its start."""
    total = get_dataset(ctx, dataset_id).record_count
    files = dataset_store(ctx).files(dataset_id)
    records, page = _json_lines(files.records, files.index, DatasetPage(dataset_id, offset, limit, total))
    return RecordsPage(**page, records=records)


def read_compression_metrics(ctx: AppContext, dataset_id: str, offset: int = 0, limit: int = 100) -> MetricsPage:
    dataset = get_dataset(ctx, dataset_id)
    files = dataset_store(ctx).files(dataset_id)
    total = dataset.record_count if files.compression.exists() else 0
    metrics, page = _json_lines(
        files.compression, files.compression_index, DatasetPage(dataset_id, offset, limit, total)
    )
    return MetricsPage(**page, metrics=metrics)


def export_dataset(ctx: AppContext, dataset_id: str, fmt: ExportFormat = "rlctl") -> Iterator[bytes]:
    """The records as JSON Lines: stored form (`rlctl`, re-importable as is) or plain ShareGPT."""
    get_dataset(ctx, dataset_id)
    path = dataset_store(ctx).files(dataset_id).records
    try:
        handle = path.open("rb")  # opened now: a deletion during the download does not cut it short
    except FileNotFoundError:
        raise DatasetNotFound(f"dataset {dataset_id} was just deleted", {"dataset_id": dataset_id}) from None
    if fmt == "rlctl":
        return _chunks_of(handle)
    return _sharegpt_lines(handle)


def export_file(ctx: AppContext, dataset_id: str, export_id: str) -> Path:
    validate_name(export_id, "export id")
    get_dataset(ctx, dataset_id)
    path = dataset_store(ctx).files(dataset_id).export(export_id)
    if not path.is_file():
        raise ExportNotFound(f"dataset {dataset_id} has no export {export_id!r}", {"export_id": export_id})
    return path


def delete_dataset(ctx: AppContext, dataset_id: str) -> None:
    """Removes the row, then the files. Derived datasets keep their parent_id (lineage outlives the parent)."""
    with ctx.db.session() as session:
        row = load_row(session, Dataset, dataset_id, DatasetNotFound)
        busy = [job.id for job in _unfinished_dataset_jobs(session) if job.params.get("dataset_id") == dataset_id]
        if busy:
            raise DatasetBusy(f"job(s) {', '.join(busy)} still read dataset {dataset_id}", {"jobs": busy})
        session.delete(row)
    dataset_store(ctx).remove(dataset_id)


# --- derived datasets (background jobs) ---


def start_filter(ctx: AppContext, dataset_id: str, request: FilterRequest) -> JobOut:
    parent = get_dataset(ctx, dataset_id)
    params = request.model_dump()
    params["tokenizer"] = resolve_tokenizer(ctx.settings, params.get("tokenizer"))
    if params.get("allowed_tools") is not None:
        params["allowed_tools"] = sorted(set(params["allowed_tools"]))
    return _submit(ctx, "dataset_filter", parent, params)


def start_compression(ctx: AppContext, dataset_id: str, request: CompressRequest) -> JobOut:
    parent = get_dataset(ctx, dataset_id)
    params = request.model_dump()
    params["tokenizer"] = resolve_tokenizer(ctx.settings, params.get("tokenizer"))
    choice = params.get("summarizer", "auto")
    configured = summary_endpoint(ctx) is not None
    if choice == "model" and not configured:
        raise SummarizerNotConfigured(
            "no summariser endpoint is configured: set RLCTL_SUMMARY_BASE_URL (or OPENROUTER_API_KEY)",
            {"summarizer": choice},
        )
    params["summarizer"] = "model" if choice == "model" or (choice == "auto" and configured) else "extractive"
    if params["summarizer"] == "model":
        params["summary_model"] = ctx.settings.summary_model
    return _submit(ctx, "dataset_compress", parent, params)


def start_scoring(ctx: AppContext, dataset_id: str, request: ScoreRequest) -> JobOut:
    parent = get_dataset(ctx, dataset_id)
    check_rewards(ctx, request.rewards)
    params = request.model_dump()
    names = [reward.name for reward in request.rewards]
    if JUDGE_REWARD in names and judge_endpoint(ctx.settings) is None:
        raise JudgeNotConfigured(
            "the judge reward needs a judge endpoint: set RLCTL_JUDGE_BASE_URL (or OPENROUTER_API_KEY)",
            {"reward": JUDGE_REWARD},
        )
    judge = request.judge
    if judge is not None and judge.calibrate_with is not None and judge.calibrate_with not in names:
        raise ValidationFailed(
            "calibrate_with names a reward of the request", {"field": "judge.calibrate_with", "rewards": names}
        )
    if any(name in GROUP_REWARDS for name in names):
        # Fixed when submitted, so a resumed job asks the same model (and the cache key stays the same).
        params["judge"] = {**(params.get("judge") or {}), "model": (judge and judge.model) or ctx.settings.judge_model}
    return _submit(ctx, "dataset_score", parent, params)


def start_grpo_export(ctx: AppContext, dataset_id: str, request: GrpoExportRequest) -> JobOut:
    parent = get_dataset(ctx, dataset_id)
    params = {**request.model_dump(), "dataset_id": parent.id}
    job_id = JobRunner.of(ctx).submit("dataset_export_grpo", params, total=parent.record_count)
    return get_job(ctx, job_id)


def summary_endpoint(ctx: AppContext) -> tuple[str, str] | None:
    """(base URL, key) of the configured summariser, or None: then the extractive summary is used."""
    settings = ctx.settings
    key = settings.summary_api_key or settings.openrouter_api_key
    base_url = settings.summary_base_url or (settings.openrouter_base_url if settings.openrouter_api_key else None)
    if base_url is None:
        return None
    return base_url, key.get_secret_value() if key else "none"


def open_datasets(ctx: AppContext) -> None:
    """At start-up, before jobs resume: remove what a crash left behind (never what a live job will need), and
    look up the run tokenizer."""
    run_tokenizer_dir(ctx.settings)
    with ctx.db.session() as session:
        jobs = _unfinished_dataset_jobs(session)
        keep = {job.id for job in jobs} | {str(job.params.get("output_id")) for job in jobs}
        known = set(session.scalars(select(Dataset.id)))
    removed = dataset_store(ctx).sweep(keep_staging=keep, known_ids=known | keep)
    if removed:
        logger.info("removed %d leftover dataset directories", len(removed))


# --- helpers ---


def _submit(ctx: AppContext, kind: str, parent: DatasetOut, params: dict[str, Any]) -> JobOut:
    operation = kind.removeprefix("dataset_")
    params = {
        **params,
        "dataset_id": parent.id,
        "output_id": new_dataset_id(),
        "name": params.get("name") or f"{parent.name[:100]}-{operation}",
    }
    job_id = JobRunner.of(ctx).submit(kind, params, total=parent.record_count)
    return get_job(ctx, job_id)


def _unfinished_dataset_jobs(session: Any) -> list[Job]:
    query = select(Job).where(Job.kind.in_(DATASET_JOB_KINDS), Job.status.in_(UNFINISHED))
    return list(session.scalars(query))


@dataclass(frozen=True)
class DatasetPage:
    dataset_id: str
    offset: int
    limit: int
    total: int


def _json_lines(lines_path: Path, index_path: Path, page: DatasetPage) -> tuple[list[Any], dict[str, Any]]:
    """The page's lines, parsed, and the page's fields with `next_offset` (null on the last page)."""
    lines = read_page(lines_path, index_path, page.offset, page.limit) if page.offset < page.total else []
    following = page.offset + len(lines)
    next_offset = following if lines and following < page.total else None
    return [json.loads(line) for line in lines], {**asdict(page), "next_offset": next_offset}


def _chunks_of(handle: BinaryIO, size: int = 1 << 20) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(size):
            yield chunk


def _sharegpt_lines(handle: BinaryIO) -> Iterator[bytes]:
    """Plain ShareGPT: `conversations` of {from, value} only, metadata keys beside them, reward when scored."""
    with handle:
        for raw in handle:
            record = record_from_dict(json.loads(raw))
            line: dict[str, Any] = {**record.metadata}
            line["conversations"] = [{"from": turn.role, "value": turn.value} for turn in record.turns]
            if record.reward is not None:
                line["reward"] = record.reward
            line.update(record_stats_fields(record))
            yield (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8")
