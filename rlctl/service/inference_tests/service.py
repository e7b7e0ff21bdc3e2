"""Inference-test operations, shared by the REST routes and the agent tool `rl_test_inference`.

An inference test is a background job of kind `inference_test` (the `jobs` table holds its parameters, progress
and result). Everything that can be checked before it runs is checked here, synchronously: the environment
exists and loads, the edits are valid, the endpoint's key is configured, the tokenizer loads.
"""

from __future__ import annotations

from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.environments.discovery import EnvironmentInfo
from rlctl.service.environments.service import plan_run_config
from rlctl.service.errors import FieldLocked, NotFound
from rlctl.service.inference_tests import preflight
from rlctl.service.inference_tests.jobs import KIND
from rlctl.service.inference_tests.schemas import CreateInferenceTestRequest, InferenceTestList, InferenceTestOut
from rlctl.service.jobs import service as jobs
from rlctl.service.jobs.runner import JobRunner
from rlctl.service.jobs.schemas import JobOut
from rlctl.service.settings import Backend
from rlctl.service.states import JobStatus

# Fields an inference test sets itself (from the request's own parameters, or because a test needs them).
TEST_FIELDS = {
    "group_size": "set it with the request's group_size",
    "total_steps": "set it with the request's num_steps",
    "batch_size": "process mode sends no batches",
    "wandb_name": "inference tests do not log to W&B",
    "ensure_scores_are_not_same": "an inference test keeps every group",
    "include_messages": "an inference test records every conversation",
}


class InferenceTestNotFound(NotFound):
    code = "INFERENCE_TEST_NOT_FOUND"
    subject = "inference test"


def start_inference_test(ctx: AppContext, request: CreateInferenceTestRequest) -> InferenceTestOut:
    """Check everything that can be checked, then queue the test; returns its record (status `queued`)."""
    env = EnvironmentCatalog.of(ctx).get(request.environment)
    timeout_s = ctx.settings.inference_test_timeout_s if request.timeout_s is None else request.timeout_s
    base_url = preflight.validate_base_url(request.base_url or ctx.settings.openrouter_base_url)
    preflight.endpoint_key(ctx.settings, base_url)  # a missing key is a 409 now, not a failure later
    preflight.require_tokenizer(ctx.settings.tokenizer_name)
    edits = validate_test_edits(ctx, env, dict(request.config))
    params = {
        "environment": env.name,
        "num_steps": request.num_steps,
        "group_size": request.group_size,
        "models": request.models,
        "base_url": base_url,
        "config": edits,
        "timeout_s": float(timeout_s),
    }
    job_id = JobRunner.of(ctx).submit(KIND, params, total=request.num_steps * len(request.models))
    return get_inference_test(ctx, job_id)


def validate_test_edits(ctx: AppContext, env: EnvironmentInfo, edits: dict[str, Any]) -> dict[str, Any]:
    """The same rules as a run's edits (types, locked fields), minus the fields the test sets itself."""
    for name in edits:
        if name in TEST_FIELDS:
            raise FieldLocked(
                f"{name} is set by the inference test: {TEST_FIELDS[name]}",
                {"field": name, "reason": TEST_FIELDS[name]},
            )
    set_by_caller = {"backend", "wandb_project", *TEST_FIELDS}
    # the schema is read in a child: the environment must import
    return plan_run_config(ctx, env.name, edits, Backend.TINKER, set_by_caller).edits


def get_inference_test(ctx: AppContext, test_id: str) -> InferenceTestOut:
    try:
        job = jobs.get_job(ctx, test_id)
    except NotFound as error:
        raise InferenceTestNotFound.for_id(test_id) from error
    if job.kind != KIND:
        raise InferenceTestNotFound.for_id(test_id)
    return inference_test_record(job)


def list_inference_tests(
    ctx: AppContext, status: JobStatus | None = None, limit: int = 50, cursor: str | None = None
) -> InferenceTestList:
    """Newest first."""
    page = jobs.list_jobs(ctx, KIND, status, limit, cursor)
    tests = [inference_test_record(job) for job in page.jobs]
    return InferenceTestList(inference_tests=tests, count=len(tests), next_cursor=page.next_cursor)


def inference_test_record(job: JobOut) -> InferenceTestOut:
    params = job.params
    return InferenceTestOut(
        id=job.id,
        environment=params["environment"],
        status=job.status,
        progress=job.progress,
        num_steps=params["num_steps"],
        group_size=params["group_size"],
        models=params["models"],
        base_url=params["base_url"],
        config=params.get("config") or {},
        timeout_s=params["timeout_s"],
        result=job.result,
        error=job.error,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
