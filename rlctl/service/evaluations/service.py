"""Evaluations (docs/EVALUATIONS.md): sample the base model and a run's checkpoints on the same prompts, score
every completion with the same rewards, and compare. Each evaluation is a job of kind `evaluation`."""

from __future__ import annotations

from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.environments.discovery import is_tool_environment
from rlctl.service.errors import EnvironmentNotFound, NotFound, ValidationFailed
from rlctl.service.evaluations.schemas import (
    EvaluationJudge,
    EvaluationModelResult,
    EvaluationOut,
    EvaluationRequest,
    PromptResult,
)
from rlctl.service.jobs.runner import JobRunner
from rlctl.service.jobs.service import get_job
from rlctl.service.rewards.errors import JudgeNotConfigured
from rlctl.service.rewards.judge import judge_endpoint
from rlctl.service.rewards.schemas import JudgeChoice, RewardSpec
from rlctl.service.rewards.service import check_rewards
from rlctl.service.runs import datasets as dataset_runs
from rlctl.service.runs.checkpoints import run_checkpoints
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.service import require_backend
from rlctl.trajectories.judge import GROUP_REWARDS

KIND = "evaluation"
BASE = "base"


class EvaluationNotFound(NotFound):
    code = "EVALUATION_NOT_FOUND"
    subject, id_field = "evaluation", "evaluation_id"


# --- start and read ---


def start_evaluation(ctx: AppContext, request: EvaluationRequest) -> EvaluationOut:
    """Check everything the job will need, then submit it (202)."""
    plan = _plan(ctx, request)
    job_id = JobRunner.of(ctx).submit(KIND, {**request.model_dump(mode="json"), **plan}, total=_total(plan, request))
    return get_evaluation(ctx, job_id)


def get_evaluation(ctx: AppContext, evaluation_id: str) -> EvaluationOut:
    try:
        job = get_job(ctx, evaluation_id)
    except NotFound:
        raise EvaluationNotFound.for_id(evaluation_id) from None
    if job.kind != KIND:
        raise EvaluationNotFound.for_id(evaluation_id)
    result = job.result or {}
    request = {k: v for k, v in job.params.items() if k in EvaluationRequest.model_fields}
    return EvaluationOut(
        id=job.id,
        status=job.status,
        progress=job.progress,
        request=request,
        models=[EvaluationModelResult.model_validate(m) for m in result["models"]] if "models" in result else None,
        prompts=[PromptResult.model_validate(p) for p in result["prompts"]] if "prompts" in result else None,
        judge=EvaluationJudge.model_validate(result["judge"]) if result.get("judge") else None,
        error=job.error,
    )


def _plan(ctx: AppContext, request: EvaluationRequest) -> dict[str, Any]:
    found = run_checkpoints(ctx, request.run_id)
    backend, config = found.backend, found.config
    require_backend(ctx, backend)  # a tinker run's weights are sampled through Tinker, with the server's key
    paths = RunPaths(ctx.settings.data_path, request.run_id)
    steps = found.steps(request.steps)
    checkpoints = found.weights
    env = config.get("env") or {}
    tinker = config.get("tinker") or {}
    models = [{"name": BASE, "weights": None}] + [{"name": f"step_{s}", "weights": checkpoints[s]} for s in steps]
    common = {
        "backend": backend.value,
        "models": models,
        "base_model": tinker.get("base_model"),
        "tokenizer_name": env.get("tokenizer_name"),
        "lora_rank": tinker.get("lora_rank"),
        "protocol": tinker.get("protocol"),
    }
    tool_env = _tool_environment(ctx, found.environment)
    if tool_env is not None:
        if request.rewards is not None or request.judge is not None:
            field = "rewards" if request.rewards is not None else "judge"
            raise ValidationFailed(
                "a tool environment's evaluation is scored by the environment's own rewards", {"field": field}
            )
        if env.get("judge_rubric") and judge_endpoint(ctx.settings) is None:
            raise JudgeNotConfigured(
                "the run's environment is scored by the judge (judge_rubric): set RLCTL_JUDGE_BASE_URL "
                "(or OPENROUTER_API_KEY)",
                {"field": "judge_rubric"},
            )
        return {**common, "rewards": [], "judge": None, "tool_env": {**tool_env, "config": env}}
    prompts, _total = dataset_runs.read_prompts(paths.run_dir, request.split, 0, request.max_prompts)
    if not prompts:
        raise ValidationFailed(
            f"run {request.run_id} has no {request.split} prompts (a run of a dataset with a held-out share has)",
            {"field": "split", "run_id": request.run_id},
        )
    rewards = [r.model_dump() for r in request.rewards] if request.rewards else env.get("rewards")
    if not rewards:
        raise ValidationFailed("name the rewards: the run has none of its own", {"field": "rewards"})
    rewards = [{"name": r["name"], "weight": r.get("weight", 1.0)} for r in rewards]
    check_rewards(ctx, [RewardSpec(**r) for r in rewards])
    own_judge = env.get("dataset_judge") if request.rewards is None else None
    return {**common, "rewards": rewards, "judge": _judge(ctx, request, [r["name"] for r in rewards], own_judge)}


def _tool_environment(ctx: AppContext, name: str) -> dict[str, str] | None:
    """The run's environment file and class when it is a multi-turn tool environment (a ToolEnv), else None: its
    held-out tasks are then played, not the run's prompts answered (docs/EVALUATIONS.md#tool-environments)."""
    catalog = EnvironmentCatalog.of(ctx)
    try:
        info = catalog.get(name)
    except (EnvironmentNotFound, ValidationFailed):
        return None  # a dataset run's, or one no longer on disk
    if not is_tool_environment(catalog.scans(), info.class_name):
        return None
    return {"file": str(info.file_path), "class_name": info.class_name}


def _judge(
    ctx: AppContext, request: EvaluationRequest, names: list[str], own: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The judge of the judge and completion rewards (each model's samples of a prompt are one group): configured
    (a completion states no outcome, so `completion` needs it too), its model and rubric fixed when submitted, so
    a restarted job asks the same (and the cache key stays the same)."""
    grouped = [name for name in names if name in GROUP_REWARDS]
    if not grouped:
        if request.judge is not None:
            raise ValidationFailed("judge applies to the judge and completion rewards only", {"field": "judge"})
        return None
    if judge_endpoint(ctx.settings) is None:
        raise JudgeNotConfigured(
            "the judge and completion rewards need a judge endpoint: set RLCTL_JUDGE_BASE_URL (or OPENROUTER_API_KEY)",
            {"rewards": grouped},
        )
    chosen, own = request.judge or JudgeChoice(), own or {}
    return {
        "model": chosen.model or own.get("model") or ctx.settings.judge_model,
        "rubric": chosen.rubric or own.get("rubric"),
    }


def _total(plan: dict[str, Any], request: EvaluationRequest) -> int:
    return len(plan["models"]) * request.max_prompts * request.samples_per_prompt
