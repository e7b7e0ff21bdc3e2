"""Tools to smoke-test the selected environment against real models before training."""

from __future__ import annotations

from typing import Any

from service.context import AppContext
from service.inference_tests import service as inference_tests
from service.inference_tests.schemas import DEFAULT_GROUP_SIZE, DEFAULT_MODELS, DEFAULT_NUM_STEPS
from service.tools.registry import Hints, Tool, nullable
from service.tools.rl_tools import selected_environment
from service.tools.sessions import SessionState

# Fields of a session's pending config that an inference test sets itself or that only training uses.
NOT_FOR_TESTS = {"backend", "wandb_project", *inference_tests.TEST_FIELDS}


def test_inference(ctx: AppContext, state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    environment = selected_environment(ctx, state)
    config = {k: v for k, v in state.pending_config.items() if k not in NOT_FOR_TESTS}
    test = inference_tests.start_inference_test(
        ctx,
        environment,
        num_steps=args["num_steps"] if args["num_steps"] is not None else DEFAULT_NUM_STEPS,
        group_size=args["group_size"] if args["group_size"] is not None else DEFAULT_GROUP_SIZE,
        models=args["models"],
        base_url=args["base_url"],
        config=config,
    )
    return {
        "test_id": test["id"],
        "status": test["status"],
        "environment": environment,
        "models": test["models"],
        "num_steps": test["num_steps"],
        "group_size": test["group_size"],
        "base_url": test["base_url"],
        "message": f"Inference test {test['id']} started: {test['num_steps']} steps x {test['group_size']} "
        f"completions on each of {len(test['models'])} models. Read its results with "
        f"rl_get_inference_test({test['id']!r}) when it has finished (a few minutes).",
    }


def get_inference_test(ctx: AppContext, _state: SessionState, args: dict[str, Any]) -> dict[str, Any]:
    test = inference_tests.get_inference_test(ctx, args["test_id"])
    result = test["result"] or {}
    answer = {
        "test_id": test["id"],
        "status": test["status"],
        "environment": test["environment"],
        "progress": test["progress"],
        "models_tested": result.get("models_tested"),
        "summary": result.get("summary"),
    }
    if test["error"]:
        answer["error"] = test["error"]
    return answer


INFERENCE_TOOLS: tuple[Tool, ...] = (
    Tool(
        "rl_test_inference",
        "Smoke-test the selected environment before training: num_steps groups of group_size completions per "
        "model on an OpenAI-compatible endpoint (OpenRouter by default), scored by the environment itself. "
        "Returns a test_id; read the results with rl_get_inference_test.",
        {
            "num_steps": nullable({"type": "integer", "minimum": 1, "maximum": 100, "description": "Default 3."}),
            "group_size": nullable({"type": "integer", "minimum": 1, "maximum": 128, "description": "Default 16."}),
            "models": nullable(
                {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": 8,
                    "description": f"Model ids at the endpoint; null: {', '.join(DEFAULT_MODELS)}.",
                }
            ),
            "base_url": nullable(
                {"type": "string", "description": "OpenAI-compatible endpoint; null: the server's default."}
            ),
        },
        test_inference,
        Hints(open_world=True),
        {"test_id": {"type": "string"}, "status": {"type": "string"}, "message": {"type": "string"}},
    ),
    Tool(
        "rl_get_inference_test",
        "Read an inference test: status, progress, and when done, per-model accuracy and latency and a summary "
        "(best_model, avg_accuracy, environment_working).",
        {"test_id": {"type": "string", "description": "The test_id returned by rl_test_inference."}},
        get_inference_test,
        Hints(read_only=True, idempotent=True),
        {"test_id": {"type": "string"}, "status": {"type": "string"}, "summary": {"type": ["object", "null"]}},
    ),
)
