"""HTTP routes of inference tests: thin adapters over rlctl.service.inference_tests.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import OPERATE, READ
from rlctl.service.deps import Ctx
from rlctl.service.inference_tests import service
from rlctl.service.inference_tests.schemas import (
    CreateInferenceTestRequest,
    InferenceTestList,
    InferenceTestOut,
    InferenceTestStatus,
)
from rlctl.service.names import name_path
from rlctl.service.pagination import DEFAULT_PAGE, PageCursor, PageLimit
from rlctl.service.schemas import error_responses, link, linked

router = APIRouter(prefix="/inference-tests", tags=["inference tests"], responses=error_responses(401, 403))
InferenceTestId = Annotated[str, name_path("Inference test id, as returned by POST /inference-tests.")]


@router.post(
    "",
    response_model=InferenceTestOut,
    status_code=202,
    summary="Start an inference test",
    responses=linked(202, "The queued test", {"GetInferenceTest": link("get_inference_test", test_id="id")})
    | error_responses(404, 409, 413, 422),
    openapi_extra=OPERATE,
)
async def create_inference_test(ctx: Ctx, body: CreateInferenceTestRequest) -> InferenceTestOut:
    """Run the environment's own prompts and scoring on `num_steps` groups of `group_size` completions from each
    model at an OpenAI-compatible endpoint (OpenRouter by default), models concurrently, each with a time-out.

    Answers 202 at once with the test (status `queued`); poll `GET /inference-tests/{id}`. A 409 says what the
    server lacks to run it (INFERENCE_KEY_MISSING: the endpoint's key; TOKENIZER_UNAVAILABLE: the tokenizer).
    """
    return await run_in_threadpool(service.start_inference_test, ctx, body)


@router.get(
    "",
    response_model=InferenceTestList,
    summary="List inference tests",
    responses=error_responses(422),
    openapi_extra=READ,
)
async def list_inference_tests(
    ctx: Ctx,
    status: Annotated[InferenceTestStatus | None, Query(description="Only tests in this state.")] = None,
    limit: PageLimit = DEFAULT_PAGE,
    cursor: PageCursor = None,
) -> InferenceTestList:
    """Newest first, `limit` at a time."""
    return await run_in_threadpool(service.list_inference_tests, ctx, status, limit, cursor)


@router.get(
    "/{test_id}",
    response_model=InferenceTestOut,
    summary="Get an inference test",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_inference_test(ctx: Ctx, test_id: InferenceTestId) -> InferenceTestOut:
    """Status (queued, running, succeeded, failed, cancelled), progress while it runs, then the result:
    `models_tested` (per model: steps, accuracy, latency, error, files) and `summary`."""
    return await run_in_threadpool(service.get_inference_test, ctx, test_id)
