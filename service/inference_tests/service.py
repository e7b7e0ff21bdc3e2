"""Inference-test operations, shared by the REST routes and the agent tool `rl_test_inference`.

An inference test is a background job of kind `inference_test` (the `jobs` table holds its parameters, progress
and result). Everything that can be checked before it runs is checked here, synchronously: the environment
exists and loads, the edits are valid, the endpoint's key is configured, the tokenizer loads.
"""

from __future__ import annotations

import re
from typing import Any

from service.context import AppContext
from service.errors import FieldLocked, NotFound, ValidationFailed
from service.inference_tests import preflight
from service.inference_tests.jobs import KIND
from service.inference_tests.schemas import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_MODELS,
    DEFAULT_NUM_STEPS,
    MAX_GROUP_SIZE,
    MAX_MODELS,
    MAX_NUM_STEPS,
    MODEL_PATTERN,
)
from service.jobs import service as jobs
from service.runs import config as run_config

_MODEL = re.compile(MODEL_PATTERN)
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


def start_inference_test(
    ctx: AppContext,
    environment: str,
    num_steps: int = DEFAULT_NUM_STEPS,
    group_size: int = DEFAULT_GROUP_SIZE,
    models: list[str] | None = None,
    base_url: str | None = None,
    config: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Check everything that can be checked, then queue the test; returns its record (status `queued`)."""
    env = ctx.catalog.get(environment)
    models = _validate_models(list(DEFAULT_MODELS) if models is None else models)
    _validate_range("num_steps", num_steps, 1, MAX_NUM_STEPS)
    _validate_range("group_size", group_size, 1, MAX_GROUP_SIZE)
    timeout_s = ctx.settings.inference_test_timeout_s if timeout_s is None else timeout_s
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 86400:
        raise ValidationFailed("timeout_s must be a number of seconds in (0, 86400]", {"field": "timeout_s"})
    base_url = preflight.validate_base_url(base_url or ctx.settings.openrouter_base_url)
    preflight.endpoint_key(ctx.settings, base_url)  # a missing key is a 409 now, not a failure later
    preflight.require_tokenizer(ctx.settings.tokenizer_name)
    edits = validate_test_edits(ctx, env, dict(config or {}))
    params = {
        "environment": env.name,
        "num_steps": num_steps,
        "group_size": group_size,
        "models": models,
        "base_url": base_url,
        "config": edits,
        "timeout_s": float(timeout_s),
    }
    job_id = ctx.jobs.submit(KIND, params, total=num_steps * len(models))
    return get_inference_test(ctx, job_id)


def validate_test_edits(ctx: AppContext, env: Any, edits: dict[str, Any]) -> dict[str, Any]:
    """The same rules as a run's edits (types, locked fields), minus the fields the test sets itself."""
    for name in edits:
        if name in TEST_FIELDS:
            raise FieldLocked(
                f"{name} is set by the inference test: {TEST_FIELDS[name]}",
                {"field": name, "reason": TEST_FIELDS[name]},
            )
    schema = ctx.catalog.config_schema(env)  # imports the environment in a child: it must load
    excluded = {"backend", "wandb_project", *TEST_FIELDS}
    fields = [
        field
        for field in run_config.configurable_fields(env.name, schema, ctx.settings, "tinker")
        if field.name not in excluded
    ]
    return run_config.validate_edits(edits, fields, schema, run_config.locked_values(ctx.settings, "tinker"))


def get_inference_test(ctx: AppContext, test_id: str) -> dict[str, Any]:
    try:
        job = jobs.get_job(ctx, test_id)
    except NotFound as error:
        raise InferenceTestNotFound(f"no inference test with id {test_id!r}", {"id": test_id}) from error
    if job["kind"] != KIND:
        raise InferenceTestNotFound(f"no inference test with id {test_id!r}", {"id": test_id})
    return inference_test_record(job)


def list_inference_tests(
    ctx: AppContext, status: str | None = None, limit: int = 50, cursor: str | None = None
) -> dict[str, Any]:
    """Newest first."""
    page = jobs.list_jobs(ctx, KIND, status, limit, cursor)
    tests = [inference_test_record(job) for job in page["jobs"]]
    return {"inference_tests": tests, "count": len(tests), "next_cursor": page["next_cursor"]}


def inference_test_record(job: dict[str, Any]) -> dict[str, Any]:
    params = job["params"]
    return {
        "id": job["id"],
        "environment": params["environment"],
        "status": job["status"],
        "progress": job["progress"],
        "num_steps": params["num_steps"],
        "group_size": params["group_size"],
        "models": params["models"],
        "base_url": params["base_url"],
        "config": params.get("config") or {},
        "timeout_s": params["timeout_s"],
        "result": job["result"],
        "error": job["error"],
        "created_at": job["created_at"],
        "started_at": job["started_at"],
        "finished_at": job["finished_at"],
    }


def _validate_models(models: Any) -> list[str]:
    if not isinstance(models, list) or not 1 <= len(models) <= MAX_MODELS:
        raise ValidationFailed(f"models must be a list of 1 to {MAX_MODELS} model ids", {"field": "models"})
    for model in models:
        if not isinstance(model, str) or not _MODEL.fullmatch(model):
            raise ValidationFailed(
                f"invalid model id {model!r}: letters, digits and . _ : @ + / -, at most 200 characters",
                {"field": "models", "value": model},
            )
    if len(set(models)) != len(models):
        raise ValidationFailed("models must not repeat a model id", {"field": "models"})
    return list(models)


def _validate_range(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationFailed(f"{name} must be an integer from {low} to {high}", {"field": name})
