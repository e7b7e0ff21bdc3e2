"""Tools to smoke-test the selected environment against real models before training."""

from __future__ import annotations

from typing import Any

from rlctl.service.auth.scopes import Scope
from rlctl.service.context import AppContext
from rlctl.service.inference_tests import service as inference_tests
from rlctl.service.inference_tests.schemas import DEFAULT_MODELS, CreateInferenceTestRequest
from rlctl.service.tools.registry import Hints, Tool
from rlctl.service.tools.rl_tools import selected_environment
from rlctl.service.tools.schemas import (
    InferenceStartedResult,
    InferenceTestArgs,
    InferenceTestReport,
    TestInferenceArgs,
)
from rlctl.service.tools.sessions import SessionState

# Fields of a session's pending config that an inference test sets itself or that only training uses.
NOT_FOR_TESTS = {"backend", "wandb_project", *inference_tests.TEST_FIELDS}


def test_inference(ctx: AppContext, state: SessionState, args: TestInferenceArgs) -> InferenceStartedResult:
    environment = selected_environment(ctx, state)
    config = {k: v for k, v in state.pending_config.items() if k not in NOT_FOR_TESTS}
    request = CreateInferenceTestRequest(environment=environment, **args.model_dump(), config=config)
    test = inference_tests.start_inference_test(ctx, request)
    return InferenceStartedResult(
        test_id=test.id,
        status=test.status,
        environment=environment,
        models=test.models,
        num_steps=test.num_steps,
        group_size=test.group_size,
        base_url=test.base_url,
        message=f"Inference test {test.id} started: {test.num_steps} steps x {test.group_size} "
        f"completions on each of {len(test.models)} models. Read its results with "
        f"rl_get_inference_test({test.id!r}) when it has finished (a few minutes).",
    )


def get_inference_test(ctx: AppContext, _state: SessionState, args: InferenceTestArgs) -> InferenceTestReport:
    test = inference_tests.get_inference_test(ctx, args.test_id)
    return InferenceTestReport(
        test_id=test.id,
        status=test.status,
        environment=test.environment,
        progress=test.progress,
        models_tested=test.result.models_tested if test.result else None,
        summary=test.result.summary if test.result else None,
        error=test.error,
    )


INFERENCE_TOOLS: tuple[Tool[Any], ...] = (
    Tool(
        "rl_test_inference",
        "Smoke-test the selected environment before training: num_steps groups of group_size completions per "
        f"model (default: {', '.join(DEFAULT_MODELS)}) on an OpenAI-compatible endpoint (OpenRouter by default), "
        "scored by the environment itself. Returns a test_id; read the results with rl_get_inference_test.",
        TestInferenceArgs,
        InferenceStartedResult,
        test_inference,
        Hints(open_world=True),
        scope=Scope.OPERATE,
        stateful=True,
    ),
    Tool(
        "rl_get_inference_test",
        "Read an inference test: status, progress, and when done, per-model accuracy and latency and a summary "
        "(best_model, avg_accuracy, environment_working).",
        InferenceTestArgs,
        InferenceTestReport,
        get_inference_test,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
)
