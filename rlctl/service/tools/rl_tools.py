"""The nine rl_* tools of environments and runs: thin adapters over their services, with the reference's field names.

With `rl_test_inference` (rlctl/service/tools/inference_tools.py) they are the reference's ten tools.
"""

from __future__ import annotations

from typing import Any

from rlctl.service.auth.scopes import Scope
from rlctl.service.context import AppContext
from rlctl.service.environments import service as environments
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.errors import RateLimited, ValidationFailed
from rlctl.service.evaluations import service as evaluations
from rlctl.service.evaluations.schemas import EvaluationOut, EvaluationRequest
from rlctl.service.runs import service as runs
from rlctl.service.runs.datasets import DATASET_ENVIRONMENTS
from rlctl.service.runs.manager import RunManager
from rlctl.service.runs.ratelimit import describe_interval, status_rule
from rlctl.service.runs.schemas import CreateRunRequest, EnvironmentShare, ResumeRunRequest, RunOut
from rlctl.service.states import RunStatus
from rlctl.service.tools.registry import STATUS_RULE, Hints, NoArguments, Tool
from rlctl.service.tools.schemas import (
    CurrentConfigResult,
    CurrentField,
    EditConfigArgs,
    EditedResult,
    EnvironmentBrief,
    EnvironmentsResult,
    EvaluationArgs,
    ListRunsArgs,
    LockedField,
    RateLimitedResult,
    ResultsResult,
    ResumeTrainingArgs,
    RunArgs,
    RunBrief,
    RunsResult,
    SelectedResult,
    SelectEnvironmentArgs,
    StartedResult,
    StartTrainingArgs,
    StatusResult,
    StoppedResult,
)
from rlctl.service.tools.sessions import SessionState, save

HISTORY_METRICS = ("reward/mean", "train/loss", "train/percent_correct", "eval/percent_correct")
HISTORY_POINTS = 50
RECENT_CHECKPOINTS = 5
STOP_WAIT_S = 30


def list_environments(ctx: AppContext, _state: SessionState, _args: NoArguments) -> EnvironmentsResult:
    listing = environments.list_environments(ctx)
    return EnvironmentsResult(
        environments=[EnvironmentBrief.model_validate(env, from_attributes=True) for env in listing.environments],
        count=listing.count,
        tips=[
            "Call rl_select_environment(name) to choose one, then rl_get_current_config to see its settings.",
            "Use rl_test_inference to check an environment against real models before training.",
        ],
        errors=listing.errors or None,
    )


def select_environment(ctx: AppContext, state: SessionState, args: SelectEnvironmentArgs) -> SelectedResult:
    env = EnvironmentCatalog.of(ctx).get(args.name)
    state.selected_environment, state.pending_config = env.name, {}
    save(ctx, state)
    return SelectedResult(
        message=f"Selected environment {env.name!r}. Its config starts from the defaults; "
        "see it with rl_get_current_config and change it with rl_edit_config.",
        environment=env.name,
        file_path=str(env.file_path),
        description=env.description,
    )


def get_current_config(ctx: AppContext, state: SessionState, _args: NoArguments) -> CurrentConfigResult:
    environment = selected_environment(ctx, state)
    detail = environments.describe_environment(ctx, environment, state.pending_config.get("backend"))
    return CurrentConfigResult(
        environment=environment,
        backend=detail.backend,
        configurable_fields=[
            CurrentField(**dict(field), current_value=state.pending_config.get(field.name, field.default))
            for field in detail.configurable_fields
        ],
        locked_fields=[
            LockedField(name=f.name, type=f.type, description=f.description, locked_value=f.value)
            for f in detail.locked_fields
        ],
        tip="Change a configurable field with rl_edit_config(field, value); locked fields are set by the "
        "operator. Then call rl_start_training.",
    )


def edit_config(ctx: AppContext, state: SessionState, args: EditConfigArgs) -> EditedResult:
    environment = selected_environment(ctx, state)
    edits = {**state.pending_config, args.field: args.value}
    environments.preview_config(ctx, environment, edits)  # validates type, lock and cross-field rules
    state.pending_config = edits
    save(ctx, state)
    return EditedResult(message=f"Set {args.field} = {args.value!r}.", field=args.field, value=args.value, config=edits)


def start_training(ctx: AppContext, state: SessionState, args: StartTrainingArgs) -> StartedResult:
    if args.dataset is not None:
        own = state.selected_environment == DATASET_ENVIRONMENTS[args.dataset.mode]
        pending = state.pending_config if own else {}
        request = CreateRunRequest(
            dataset=args.dataset,
            config={k: v for k, v in pending.items() if k != "backend"},
            backend=args.backend or pending.get("backend"),
            resources=args.resources,
            priority=args.priority,
            init_from=args.init_from,
        )
    elif args.environments is not None:  # a mixed run (docs/RUNS.md#mixed-environments)
        request = CreateRunRequest(
            environments=[EnvironmentShare(name=share.name, weight=share.weight) for share in args.environments],
            config={k: v for k, v in state.pending_config.items() if k != "backend"},
            backend=args.backend or state.pending_config.get("backend"),
            resources=args.resources,
            priority=args.priority,
            init_from=args.init_from,
        )
    else:
        request = CreateRunRequest(
            environment=selected_environment(ctx, state),
            config={k: v for k, v in state.pending_config.items() if k != "backend"},
            backend=args.backend or state.pending_config.get("backend"),
            resources=args.resources,
            priority=args.priority,
            init_from=args.init_from,
        )
    edits = request.config
    run, _created = runs.create_run(ctx, RunManager.of(ctx), request)
    interval = describe_interval(ctx.settings.status_check_interval_s)
    return _started(
        ctx,
        run,
        edits,
        (
            f"Training run {run.id} waits in the queue at position {run.queue_position} until a slot frees. "
            if run.status == "queued"
            else f"Training run {run.id} is starting on the {run.backend} backend. "
        )
        + f"Check it with rl_check_status({run.id!r}) in about {interval}. ",
    )


def _started(ctx: AppContext, run: RunOut, config: dict[str, Any], message: str) -> StartedResult:
    """What starting or resuming a run answers; the message ends with the status-check rule."""
    return StartedResult(
        run_id=run.id,
        status=run.status,
        environment=run.environment,
        dataset_id=run.dataset_id,
        backend=run.backend,
        config=config,
        wandb_project=run.wandb_project,
        wandb_run_name=run.wandb_run_name,
        config_path=run.config_path,
        logs=run.logs,
        message=message + status_rule(ctx.settings.status_check_interval_s),
    )


def evaluate(ctx: AppContext, _state: SessionState, args: EvaluationRequest) -> EvaluationOut:
    return evaluations.start_evaluation(ctx, args)


def get_evaluation(ctx: AppContext, _state: SessionState, args: EvaluationArgs) -> EvaluationOut:
    return evaluations.get_evaluation(ctx, args.evaluation_id)


def check_status(ctx: AppContext, _state: SessionState, args: RunArgs) -> StatusResult | RateLimitedResult:
    try:
        snapshot = runs.check_status(ctx, args.run_id)
    except RateLimited as limited:
        return RateLimitedResult(
            rate_limited=True,
            run_id=args.run_id,
            message=limited.message,
            next_check_in_seconds=limited.details["next_check_in_seconds"],
            last_snapshot=limited.details.get("last_snapshot"),
            stored=limited.details.get("stored"),
        )
    return StatusResult.model_validate(snapshot, from_attributes=True)


def stop_training(ctx: AppContext, _state: SessionState, args: RunArgs) -> StoppedResult:
    run = runs.stop_run(ctx, RunManager.of(ctx), args.run_id, wait_s=STOP_WAIT_S)
    stopped = run.status == RunStatus.STOPPED
    return StoppedResult(
        run_id=run.id, status=run.status, message="The run stopped." if stopped else "The run is stopping."
    )


def resume_training(ctx: AppContext, _state: SessionState, args: ResumeTrainingArgs) -> StartedResult:
    run = runs.resume_run(ctx, RunManager.of(ctx), args.run_id, ResumeRunRequest(step=args.step))
    return _started(
        ctx,
        run,
        {},
        f"Run {run.id} resumes from the checkpoint of step {run.last_step} with its optimiser state; "
        + f"check it with rl_check_status({run.id!r}). ",
    )


def get_results(ctx: AppContext, _state: SessionState, args: RunArgs) -> ResultsResult:
    results = runs.get_results(ctx, args.run_id)
    return ResultsResult(
        **results.model_dump(include=set(ResultsResult.model_fields) - {"history", "checkpoints"}),
        history={
            name: _downsample(points, HISTORY_POINTS)
            for name, points in results.history.items()
            if name in HISTORY_METRICS
        },
        checkpoints=results.checkpoints[-RECENT_CHECKPOINTS:],
    )


def list_runs(ctx: AppContext, _state: SessionState, args: ListRunsArgs) -> RunsResult:
    listing = runs.list_runs(
        ctx, status=args.status, environment=args.environment, limit=args.limit, cursor=args.cursor
    )
    return RunsResult(
        runs=[
            RunBrief(
                run_id=r.id,
                environment=r.environment,
                backend=r.backend,
                status=r.status,
                queue_position=r.queue_position,
                step=r.last_step,
                total_steps=r.total_steps,
                created_at=r.created_at,
            )
            for r in listing.runs
        ],
        count=listing.count,
        has_more=listing.next_cursor is not None,
        next_cursor=listing.next_cursor,
    )


def selected_environment(ctx: AppContext, state: SessionState) -> str:
    if not state.selected_environment:
        available = [e.name for e in environments.list_environments(ctx).environments]
        raise ValidationFailed(
            "no environment selected: call rl_select_environment(name) first", {"available": available}
        )
    return state.selected_environment


def _downsample(points: list[list[float]], limit: int) -> list[list[float]]:
    if len(points) <= limit:
        return points
    stride = len(points) / limit
    picked = [points[int(i * stride)] for i in range(limit - 1)]
    return [*picked, points[-1]]


RL_TOOLS: tuple[Tool[Any], ...] = (
    Tool(
        "rl_list_environments",
        "List the RL environments that can be trained (name, description, file). Start here.",
        NoArguments,
        EnvironmentsResult,
        list_environments,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
    Tool(
        "rl_select_environment",
        "Select the environment to configure and train (resets this session's pending config). "
        "Use a name from rl_list_environments.",
        SelectEnvironmentArgs,
        SelectedResult,
        select_environment,
        Hints(idempotent=True),
        scope=Scope.OPERATE,
        stateful=True,
    ),
    Tool(
        "rl_get_current_config",
        "Show the selected environment's configurable fields (with current values) and the locked fields set by "
        "the operator.",
        NoArguments,
        CurrentConfigResult,
        get_current_config,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
        stateful=True,
    ),
    Tool(
        "rl_edit_config",
        "Change one configurable field of the pending config (validated against its type; locked fields refuse).",
        EditConfigArgs,
        EditedResult,
        edit_config,
        Hints(idempotent=True),
        scope=Scope.OPERATE,
        stateful=True,
    ),
    Tool(
        "rl_start_training",
        "Start a training run of the selected environment with the pending config (launches the Atropos API, the "
        "trainer and the environment), or, with `dataset`, a run that trains on a trajectory dataset (offline: its "
        f"scored completions; online: its prompts). Returns the run_id. {STATUS_RULE}",
        StartTrainingArgs,
        StartedResult,
        start_training,
        Hints(open_world=True),
        scope=Scope.OPERATE,
        stateful=True,
    ),
    Tool(
        "rl_check_status",
        f"Check a run live: processes, running time, step, reward and accuracy. {STATUS_RULE}",
        RunArgs,
        StatusResult | RateLimitedResult,
        check_status,
        Hints(),  # not read-only: a live check spends the run's allowance (docs/RUNS.md)
        scope=Scope.READ,
    ),
    Tool(
        "rl_stop_training",
        "Stop a run (environment, then trainer, then API). Use when a run should end early.",
        RunArgs,
        StoppedResult,
        stop_training,
        Hints(destructive=True, idempotent=True),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_resume_training",
        "Resume a stopped or failed run from its newest checkpoint (or the one of `step`) with its optimiser state: "
        "the same run id, its history continued. Later checkpoints and metrics are dropped.",
        ResumeTrainingArgs,
        StartedResult,
        resume_training,
        Hints(open_world=True),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_get_results",
        "Get a run's final metrics, metric history, checkpoints and trained weights (path or tinker:// URI).",
        RunArgs,
        ResultsResult,
        get_results,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
    Tool(
        "rl_list_runs",
        "List training runs, newest first, optionally by status or environment, a page at a time: when has_more "
        "is true, call again with cursor = next_cursor. Not rate limited.",
        ListRunsArgs,
        RunsResult,
        list_runs,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
)

# After the inference tools in the catalog: agents see the ten run tools and rl_test_inference first.
EVALUATION_TOOLS: tuple[Tool[Any], ...] = (
    Tool(
        "rl_evaluate",
        "Evaluate a run: sample its base model and checkpoints (default: the newest) on the same held-out prompts, "
        "score them with the same rewards and compare (mean reward, difference to the base with a 95 % bootstrap "
        "interval, win rate per prompt). A job: poll rl_get_evaluation.",
        EvaluationRequest,
        EvaluationOut,
        evaluate,
        Hints(open_world=False),
        scope=Scope.OPERATE,
    ),
    Tool(
        "rl_get_evaluation",
        "Get an evaluation: its progress, then each model's mean reward, difference to the base with its 95 % "
        "interval, win rate, and the per-prompt results.",
        EvaluationArgs,
        EvaluationOut,
        get_evaluation,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
)
