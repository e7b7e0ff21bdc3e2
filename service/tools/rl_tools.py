"""The nine rl_* tools of environments and runs: thin adapters over their services, with the reference's field names.

With `rl_test_inference` (service/tools/inference_tools.py) they are the reference's ten tools.
"""

from __future__ import annotations

from typing import Any

from service.context import AppContext
from service.environments import service as environments
from service.errors import RateLimited, ValidationFailed
from service.runs import service as runs
from service.tools.registry import Hints, Tool, nullable
from service.tools.sessions import SessionState, save

STATUS_RULE = (
    "Live status checks are limited to one per run every 30 minutes: a check sooner returns rate_limited with "
    "next_check_in_seconds, so wait that long instead of polling."
)
HISTORY_METRICS = ("reward/mean", "train/loss", "train/percent_correct", "eval/percent_correct")
HISTORY_POINTS = 50
RUN_ID = {"type": "string", "description": "The run id returned by rl_start_training or rl_list_runs."}


def list_environments(ctx: AppContext, _state: SessionState, _args: dict[str, Any]) -> dict[str, Any]:
    listing = environments.list_environments(ctx)
    result: dict[str, Any] = {
        "environments": [
            {k: env[k] for k in ("name", "description", "class_name", "file_path")} for env in listing["environments"]
        ],
        "count": listing["count"],
        "tips": [
            "Call rl_select_environment(name) to choose one, then rl_get_current_config to see its settings.",
            "Use rl_test_inference to check an environment against real models before training.",
        ],
    }
    if listing["errors"]:
        result["errors"] = listing["errors"]
    return result


def select_environment(ctx: AppContext, state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    env = ctx.catalog.get(args["name"])
    state.selected_environment, state.pending_config = env.name, {}
    save(ctx, state)
    return {
        "message": f"Selected environment {env.name!r}. Its config starts from the defaults; "
        "see it with rl_get_current_config and change it with rl_edit_config.",
        "environment": env.name,
        "file_path": str(env.file_path),
        "description": env.description,
    }


def get_current_config(ctx: AppContext, state: SessionState, _args: dict[str, Any]) -> dict[str, Any]:
    environment = selected_environment(ctx, state)
    detail = environments.describe_environment(ctx, environment, state.pending_config.get("backend"))
    return {
        "environment": environment,
        "backend": detail["backend"],
        "configurable_fields": [
            {**field, "current_value": state.pending_config.get(field["name"], field["default"])}
            for field in detail["configurable_fields"]
        ],
        "locked_fields": [
            {"name": f["name"], "type": f["type"], "description": f["description"], "locked_value": f["value"]}
            for f in detail["locked_fields"]
        ],
        "tip": "Change a configurable field with rl_edit_config(field, value); locked fields are set by the "
        "operator. Then call rl_start_training.",
    }


def edit_config(ctx: AppContext, state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    environment = selected_environment(ctx, state)
    field, value = args["field"], args["value"]
    edits = {**state.pending_config, field: value}
    environments.preview_config(ctx, environment, edits)  # validates type, lock and cross-field rules
    state.pending_config = edits
    save(ctx, state)
    return {"message": f"Set {field} = {value!r}.", "field": field, "value": value, "config": edits}


def start_training(ctx: AppContext, state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    environment = selected_environment(ctx, state)
    edits = {k: v for k, v in state.pending_config.items() if k != "backend"}
    backend = args.get("backend") or state.pending_config.get("backend")
    run, _created = runs.create_run(ctx, ctx.runs, environment, edits, backend)
    return {
        "run_id": run["id"],
        "status": run["status"],
        "environment": environment,
        "backend": run["backend"],
        "config": edits,
        "wandb_project": run["wandb_project"],
        "wandb_run_name": run["wandb_run_name"],
        "config_path": run["config_path"],
        "logs": run["logs"],
        "message": f"Training run {run['id']} is starting on the {run['backend']} backend. "
        f"Check it with rl_check_status({run['id']!r}) in about 30 minutes. {STATUS_RULE}",
    }


def check_status(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    try:
        snapshot = runs.check_status(ctx, args["run_id"])
    except RateLimited as limited:
        return {
            "rate_limited": True,
            "run_id": args["run_id"],
            "message": limited.message,
            "next_check_in_seconds": limited.details["next_check_in_seconds"],
            "last_snapshot": limited.details.get("last_snapshot"),
        }
    return {
        "run_id": snapshot["run_id"],
        "status": snapshot["status"],
        "environment": snapshot["environment"],
        "processes": snapshot["processes"],
        "running_time_minutes": snapshot["running_time_minutes"],
        "metrics": snapshot["metrics"],
        "stalled": snapshot["stalled"],
        "failure": snapshot["failure"],
        "wandb_project": snapshot["wandb_project"],
        "wandb_run_name": snapshot["wandb_run_name"],
        "wandb_url": snapshot["wandb_url"],
        "logs": snapshot["logs"],
        "next_check_in_seconds": snapshot["next_check_in_seconds"],
    }


def stop_training(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.stop_run(ctx, ctx.runs, args["run_id"], wait_s=30)
    return {
        "run_id": run["id"],
        "status": run["status"],
        "message": "The run stopped." if run["status"] == "stopped" else "The run is stopping.",
    }


def get_results(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    results = runs.get_results(ctx, args["run_id"])
    return {
        "run_id": results["run_id"],
        "status": results["status"],
        "environment": results["environment"],
        "final_step": results["final_step"],
        "total_steps": results["total_steps"],
        "final_metrics": results["final_metrics"],
        "history": {
            name: _downsample(points, HISTORY_POINTS)
            for name, points in results["history"].items()
            if name in HISTORY_METRICS
        },
        "weights": results["weights"],
        "checkpoints": results["checkpoints"][-5:],
        "wandb_project": results["wandb_project"],
        "wandb_run_name": results["wandb_run_name"],
        "wandb_url": results["wandb_url"],
        "failure": results["failure"],
    }


def list_runs(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    listing = runs.list_runs(ctx, status=args.get("status"), environment=args.get("environment"), limit=50)
    return {
        "runs": [
            {
                "run_id": r["id"],
                "environment": r["environment"],
                "backend": r["backend"],
                "status": r["status"],
                "step": r["last_step"],
                "total_steps": r["total_steps"],
                "created_at": r["created_at"],
            }
            for r in listing["runs"]
        ],
        "count": listing["count"],
    }


def selected_environment(ctx: AppContext, state: SessionState) -> str:
    if not state.selected_environment:
        available = [e["name"] for e in environments.list_environments(ctx)["environments"]]
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


RL_TOOLS: tuple[Tool, ...] = (
    Tool(
        "rl_list_environments",
        "List the RL environments that can be trained (name, description, file). Start here.",
        {},
        list_environments,
        Hints(read_only=True, idempotent=True),
        {"environments": {"type": "array"}, "count": {"type": "integer"}, "tips": {"type": "array"}},
    ),
    Tool(
        "rl_select_environment",
        "Select the environment to configure and train (resets this session's pending config). "
        "Use a name from rl_list_environments.",
        {"name": {"type": "string", "description": "Environment name, e.g. gsm8k."}},
        select_environment,
        Hints(idempotent=True),
        {"message": {"type": "string"}, "environment": {"type": "string"}, "file_path": {"type": "string"}},
    ),
    Tool(
        "rl_get_current_config",
        "Show the selected environment's configurable fields (with current values) and the locked fields set by "
        "the operator.",
        {},
        get_current_config,
        Hints(read_only=True, idempotent=True),
        {
            "environment": {"type": "string"},
            "configurable_fields": {"type": "array"},
            "locked_fields": {"type": "array"},
        },
    ),
    Tool(
        "rl_edit_config",
        "Change one configurable field of the pending config (validated against its type; locked fields refuse).",
        {
            "field": {"type": "string", "description": "A configurable field name from rl_get_current_config."},
            "value": {
                "anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}],
                "description": "The new value, of the field's type.",
            },
        },
        edit_config,
        Hints(idempotent=True),
        {"message": {"type": "string"}, "field": {"type": "string"}, "config": {"type": "object"}},
    ),
    Tool(
        "rl_start_training",
        "Start a training run of the selected environment with the pending config (launches the Atropos API, the "
        f"trainer and the environment). Returns the run_id. {STATUS_RULE}",
        {
            "backend": nullable(
                {
                    "type": "string",
                    "enum": ["tinker", "local"],
                    "description": "tinker (the Tinker service) or local (this machine); null: the server default.",
                }
            )
        },
        start_training,
        Hints(open_world=True),
        {
            "run_id": {"type": "string"},
            "status": {"type": "string"},
            "backend": {"type": "string"},
            "logs": {"type": "object"},
            "message": {"type": "string"},
        },
    ),
    Tool(
        "rl_check_status",
        f"Check a run live: processes, running time, step, reward and accuracy. {STATUS_RULE}",
        {"run_id": RUN_ID},
        check_status,
        Hints(read_only=True),
        {
            "run_id": {"type": "string"},
            "status": {"type": "string"},
            "rate_limited": {"type": "boolean"},
            "next_check_in_seconds": {"type": "number"},
            "metrics": {"type": "object"},
        },
    ),
    Tool(
        "rl_stop_training",
        "Stop a run (environment, then trainer, then API). Use when a run should end early.",
        {"run_id": RUN_ID},
        stop_training,
        Hints(destructive=True, idempotent=True),
        {"run_id": {"type": "string"}, "status": {"type": "string"}, "message": {"type": "string"}},
    ),
    Tool(
        "rl_get_results",
        "Get a run's final metrics, metric history, checkpoints and trained weights (path or tinker:// URI).",
        {"run_id": RUN_ID},
        get_results,
        Hints(read_only=True, idempotent=True),
        {"run_id": {"type": "string"}, "final_metrics": {"type": "object"}, "weights": {"type": ["string", "null"]}},
    ),
    Tool(
        "rl_list_runs",
        "List training runs, newest first, optionally by status or environment. Not rate limited.",
        {
            "status": nullable(
                {
                    "type": "string",
                    "enum": ["pending", "starting", "running", "stopping", "stopped", "completed", "failed"],
                    "description": "Only runs in this state; null for all.",
                }
            ),
            "environment": nullable({"type": "string", "description": "Only runs of this environment; null for all."}),
        },
        list_runs,
        Hints(read_only=True, idempotent=True),
        {"runs": {"type": "array"}, "count": {"type": "integer"}},
    ),
)
