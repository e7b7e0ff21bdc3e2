"""Tools for the offline half of the loop: trajectories in, compressed and scored, GRPO data out.

Thin adapters over service/datasets, service/collections and service/jobs, like the REST routes.
"""

from __future__ import annotations

from typing import Any

from service.collections import service as collections
from service.context import AppContext
from service.datasets import service as datasets
from service.jobs import service as jobs
from service.tools.registry import Hints, Tool, nullable
from service.tools.sessions import SessionState
from trajectories.importing import FORMAT_NAMES

DATASET_ID = {"type": "string", "description": "A dataset id from rl_upload_dataset or rl_list_datasets."}
JOB_RESULT = {"job_id": {"type": "string"}, "status": {"type": "string"}, "message": {"type": "string"}}


def upload_dataset(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    lines = args["content"].splitlines(keepends=True)
    dataset = datasets.upload_dataset(ctx, args["name"], args["format"] or "auto", lines, args["on_error"] or "fail")
    return {
        "dataset_id": dataset["id"],
        "name": dataset["name"],
        "record_count": dataset["record_count"],
        "report": dataset["report"],
        "message": "Stored as ShareGPT trajectories (think / tool_call / tool_response tags). Next: "
        "rl_dataset_stats, rl_compress_dataset, rl_score_dataset, rl_export_grpo.",
    }


def list_datasets(ctx: AppContext, _state: SessionState, _args: dict[str, Any]) -> dict[str, Any]:
    listing = datasets.list_datasets(ctx)
    keys = ("id", "name", "parent_id", "operation", "record_count", "created_at")
    return {"datasets": [{k: d[k] for k in keys} for d in listing["datasets"]], "count": listing["count"]}


def dataset_stats(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    return datasets.dataset_stats(ctx, args["dataset_id"])


def compress_dataset(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    params = {k: args[k] for k in ("target_max_tokens", "summary_target_tokens") if args[k] is not None}
    return _job_started(datasets.start_compression(ctx, args["dataset_id"], params), "compressed dataset")


def score_dataset(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {"rewards": args["rewards"]}
    if args["answer_field"] is not None:
        params["answer_field"] = args["answer_field"]
    return _job_started(datasets.start_scoring(ctx, args["dataset_id"], params), "scored dataset")


def export_grpo(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    params = {"group_by": args["group_by"]} if args["group_by"] is not None else {}
    return _job_started(datasets.start_grpo_export(ctx, args["dataset_id"], params), "GRPO export")


def collect_trajectories(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    params = {k: v for k, v in args.items() if v is not None}
    collection = collections.create_collection(ctx, params)
    return {
        "collection_id": collection["id"],
        "status": collection["status"],
        "progress": collection["progress"],
        "message": f"Collecting {collection['progress']['total']} trajectories; follow it with "
        f"rl_get_job({collection['job_id']!r}). The dataset appears in rl_list_datasets when it ends.",
        "job_id": collection["job_id"],
    }


def get_job(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    job = jobs.get_job(ctx, args["job_id"])
    answer = {k: job[k] for k in ("id", "kind", "status", "progress", "result")}
    if job["error"]:
        answer["error"] = job["error"]
    return answer


def _job_started(job: dict[str, Any], what: str) -> dict[str, Any]:
    return {
        "job_id": job["id"],
        "status": job["status"],
        "message": f"Started the {what} in the background; rl_get_job({job['id']!r}) shows its progress and, "
        "when it succeeds, the new dataset_id in its result.",
    }


DATASET_TOOLS: tuple[Tool, ...] = (
    Tool(
        "rl_upload_dataset",
        "Store agent conversations as a trajectory dataset: JSONL content, one conversation a line (OpenAI "
        "`messages`, ShareGPT `conversations`, or another known agent-log format). Converted to ShareGPT with "
        "<think>/<tool_call>/<tool_response> tags.",
        {
            "name": {"type": "string", "description": "Dataset name (letters, digits, '_' and '-')."},
            "content": {"type": "string", "description": "The JSONL text."},
            "format": nullable({"type": "string", "enum": list(FORMAT_NAMES), "description": "Default: auto."}),
            "on_error": nullable(
                {
                    "type": "string",
                    "enum": ["fail", "skip"],
                    "description": "fail (default): any bad line stores nothing; skip: keep the good lines.",
                }
            ),
        },
        upload_dataset,
        Hints(),
        {"dataset_id": {"type": "string"}, "record_count": {"type": "integer"}, "report": {"type": "object"}},
    ),
    Tool(
        "rl_list_datasets",
        "List trajectory datasets, newest first, with their lineage (parent and operation).",
        {},
        list_datasets,
        Hints(read_only=True, idempotent=True),
        {"datasets": {"type": "array"}, "count": {"type": "integer"}},
    ),
    Tool(
        "rl_dataset_stats",
        "A dataset's statistics: tool calls with success and failure rates, reasoning coverage, token "
        "distribution, completion rate.",
        {"dataset_id": DATASET_ID},
        dataset_stats,
        Hints(read_only=True, idempotent=True),
        {"dataset_id": {"type": "string"}, "stats": {"type": "object"}},
    ),
    Tool(
        "rl_compress_dataset",
        "Compress long trajectories to a token budget (default 15250, summaries of 750 tokens; the head and the last "
        "4 turns are kept). Runs in the background and makes a new dataset.",
        {
            "dataset_id": DATASET_ID,
            "target_max_tokens": nullable({"type": "integer", "minimum": 1, "description": "Default 15250."}),
            "summary_target_tokens": nullable({"type": "integer", "minimum": 1, "description": "Default 750."}),
        },
        compress_dataset,
        Hints(),
        JOB_RESULT,
    ),
    Tool(
        "rl_score_dataset",
        "Score every trajectory with weighted reward functions (correctness: 2.0 when the expected answer is in the "
        "final answer; format: 0.25 for <think>, 0.25 for <tool_call>; or an environment's scorer by name, e.g. "
        "gsm8k). Runs in the background and makes a new dataset whose records carry reward and reward_breakdown.",
        {
            "dataset_id": DATASET_ID,
            "rewards": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "weight": {"type": "number"}},
                    "required": ["name", "weight"],
                    "additionalProperties": False,
                },
                "description": 'e.g. [{"name": "correctness", "weight": 1.0}, {"name": "format", "weight": 1.0}]',
            },
            "answer_field": nullable(
                {"type": "string", "description": "Metadata field with the expected answer; default 'answer'."}
            ),
        },
        score_dataset,
        Hints(),
        JOB_RESULT,
    ),
    Tool(
        "rl_export_grpo",
        "Export a scored dataset for GRPO: records grouped by prompt with their rewards and group-relative "
        "advantages (groups of one are reported, not kept). Runs in the background.",
        {
            "dataset_id": DATASET_ID,
            "group_by": nullable(
                {"type": "string", "description": "Metadata field to group by; default: the first user turn."}
            ),
        },
        export_grpo,
        Hints(),
        JOB_RESULT,
    ),
    Tool(
        "rl_collect_trajectories",
        "Run an agent (an OpenAI-compatible chat model with sandboxed terminal/read_file/write_file tools) over "
        "prompts, runs_per_prompt times each (at least 2, for GRPO groups), into a new dataset. Resumable.",
        {
            "name": {"type": "string", "description": "Name of the dataset it produces."},
            "prompts": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "prompt": {"type": "string"},
                        "answer": {"type": ["string", "null"], "description": "Expected answer, for scoring."},
                    },
                    "required": ["prompt", "answer"],
                    "additionalProperties": False,
                },
            },
            "base_url": {"type": "string", "description": "OpenAI-compatible endpoint, e.g. a run's inference URL."},
            "model": {"type": "string"},
            "runs_per_prompt": nullable({"type": "integer", "minimum": 2, "description": "Default 2."}),
            "max_turns": nullable({"type": "integer", "minimum": 1, "description": "Default 10."}),
            "discard_without_reasoning": nullable({"type": "boolean", "description": "Default false."}),
        },
        collect_trajectories,
        Hints(open_world=True),
        {"collection_id": {"type": "string"}, "job_id": {"type": "string"}, "status": {"type": "string"}},
    ),
    Tool(
        "rl_get_job",
        "Read a background job (compress, score, export, collection, inference test): status, progress "
        "{done, total}, and its result (e.g. the new dataset_id) or error.",
        {"job_id": {"type": "string", "description": "The job_id a tool returned."}},
        get_job,
        Hints(read_only=True, idempotent=True),
        {"status": {"type": "string"}, "progress": {"type": "object"}, "result": {"type": ["object", "null"]}},
    ),
)
