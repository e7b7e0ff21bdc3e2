"""Tools for the offline half of the loop: trajectories in, compressed and scored, GRPO data out.

Thin adapters over rlctl/service/datasets, rlctl/service/collections and rlctl/service/jobs, like the REST routes,
taking the same request models.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from rlctl.service.auth.scopes import Scope
from rlctl.service.collections import service as collections
from rlctl.service.collections.schemas import CreateCollectionRequest
from rlctl.service.context import AppContext
from rlctl.service.datasets import service as datasets
from rlctl.service.datasets.schemas import (
    CompressRequest,
    DatasetStatsOut,
    GrpoExportRequest,
    ScoreRequest,
    UploadOptions,
)
from rlctl.service.jobs import service as jobs
from rlctl.service.jobs.schemas import JobOut
from rlctl.service.tools.registry import Hints, NoArguments, Tool
from rlctl.service.tools.schemas import (
    CollectionStartedResult,
    CompressDatasetArgs,
    DatasetArgs,
    DatasetBrief,
    DatasetsResult,
    ExportGrpoArgs,
    JobArgs,
    JobResult,
    JobStartedResult,
    ScoreDatasetArgs,
    UploadDatasetArgs,
    UploadedResult,
)
from rlctl.service.tools.sessions import SessionState

RequestT = TypeVar("RequestT", bound=BaseModel)
COMPRESSION = CompressRequest.model_fields


def upload_dataset(ctx: AppContext, _state: SessionState, args: UploadDatasetArgs) -> UploadedResult:
    options = UploadOptions(name=args.name, format=args.format, on_error=args.on_error)
    dataset = datasets.upload_dataset(ctx, options, args.content.splitlines(keepends=True))
    return UploadedResult(
        dataset_id=dataset.id,
        name=dataset.name,
        record_count=dataset.record_count,
        report=dataset.report,
        message="Stored as ShareGPT trajectories (think / tool_call / tool_response tags). Next: "
        "rl_dataset_stats, rl_compress_dataset, rl_score_dataset, rl_export_grpo.",
    )


def list_datasets(ctx: AppContext, _state: SessionState, _args: NoArguments) -> DatasetsResult:
    listing = datasets.list_datasets(ctx)
    briefs = [DatasetBrief.model_validate(d, from_attributes=True) for d in listing.datasets]
    return DatasetsResult(datasets=briefs, count=listing.count)


def dataset_stats(ctx: AppContext, _state: SessionState, args: DatasetArgs) -> DatasetStatsOut:
    return datasets.dataset_stats(ctx, args.dataset_id)


def compress_dataset(ctx: AppContext, _state: SessionState, args: CompressDatasetArgs) -> JobStartedResult:
    job = datasets.start_compression(ctx, args.dataset_id, _request(CompressRequest, args))
    return _job_started(job, "compressed dataset")


def score_dataset(ctx: AppContext, _state: SessionState, args: ScoreDatasetArgs) -> JobStartedResult:
    return _job_started(datasets.start_scoring(ctx, args.dataset_id, _request(ScoreRequest, args)), "scored dataset")


def export_grpo(ctx: AppContext, _state: SessionState, args: ExportGrpoArgs) -> JobStartedResult:
    job = datasets.start_grpo_export(ctx, args.dataset_id, _request(GrpoExportRequest, args))
    return _job_started(job, "GRPO export")


def collect_trajectories(
    ctx: AppContext, _state: SessionState, args: CreateCollectionRequest
) -> CollectionStartedResult:
    collection = collections.create_collection(ctx, args)
    return CollectionStartedResult(
        collection_id=collection.id,
        status=collection.status,
        progress=collection.progress,
        message=f"Collecting {collection.progress.total} trajectories; follow it with "
        f"rl_get_job({collection.job_id!r}). The dataset appears in rl_list_datasets when it ends.",
        job_id=collection.job_id,
    )


def get_job(ctx: AppContext, _state: SessionState, args: JobArgs) -> JobResult:
    return JobResult.model_validate(jobs.get_job(ctx, args.job_id), from_attributes=True)


def _request(model: type[RequestT], args: DatasetArgs) -> RequestT:
    """The operation's REST request, from tool arguments that are that request plus the dataset id."""
    return model.model_validate(args.model_dump(exclude={"dataset_id"}))


def _job_started(job: JobOut, what: str) -> JobStartedResult:
    return JobStartedResult(
        job_id=job.id,
        status=job.status,
        message=f"Started the {what} in the background; rl_get_job({job.id!r}) shows its progress and, "
        "when it succeeds, the new dataset_id in its result.",
    )


DATASET_TOOLS: tuple[Tool[Any], ...] = (
    Tool(
        "rl_upload_dataset",
        "Store agent conversations as a trajectory dataset: JSONL content, one conversation a line (OpenAI "
        "`messages`, ShareGPT `conversations`, or another known agent-log format). Converted to ShareGPT with "
        "<think>/<tool_call>/<tool_response> tags.",
        UploadDatasetArgs,
        UploadedResult,
        upload_dataset,
        Hints(),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_list_datasets",
        "List trajectory datasets, newest first, with their lineage (parent and operation).",
        NoArguments,
        DatasetsResult,
        list_datasets,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
    Tool(
        "rl_dataset_stats",
        "A dataset's statistics: tool calls with success and failure rates, reasoning coverage, token "
        "distribution, completion rate.",
        DatasetArgs,
        DatasetStatsOut,
        dataset_stats,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
    Tool(
        "rl_compress_dataset",
        f"Compress long trajectories to a token budget (default {COMPRESSION['target_max_tokens'].default}, "
        f"summaries of {COMPRESSION['summary_target_tokens'].default} tokens; the head and the last "
        f"{COMPRESSION['protect_last_n_turns'].default} turns are kept). Runs in the background and makes a new "
        "dataset.",
        CompressDatasetArgs,
        JobStartedResult,
        compress_dataset,
        Hints(),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_score_dataset",
        "Score every trajectory with weighted reward functions (correctness: 2.0 when the expected answer is in the "
        "final answer; format: 0.25 for <think>, 0.25 for <tool_call>; or an environment's scorer by name, e.g. "
        "gsm8k; judge: a judge model scores each prompt's group against a rubric, 0-1 with a reason; completion: "
        "2 complete, 1 partial, 0 failed, by the source's outcome else the judge). Runs in the background and makes "
        "a new dataset whose records carry reward, reward_breakdown and the judge's reward_reasons.",
        ScoreDatasetArgs,
        JobStartedResult,
        score_dataset,
        Hints(),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_export_grpo",
        "Export a scored dataset for GRPO: records grouped by prompt with their rewards and group-relative "
        "advantages (groups of one are reported, not kept). Runs in the background.",
        ExportGrpoArgs,
        JobStartedResult,
        export_grpo,
        Hints(),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_collect_trajectories",
        "Run an agent (an OpenAI-compatible chat model with sandboxed terminal/read_file/write_file tools) over "
        "prompts, runs_per_prompt times each (at least 2, for GRPO groups), into a new dataset. Resumable. "
        "model may be a run's checkpoint {run, step} (no base_url): the service serves it.",
        CreateCollectionRequest,
        CollectionStartedResult,
        collect_trajectories,
        Hints(open_world=True),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_get_job",
        "Read a background job (compress, score, export, collection, inference test): status, progress "
        "{done, total}, and its result (e.g. the new dataset_id) or error.",
        JobArgs,
        JobResult,
        get_job,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
)
