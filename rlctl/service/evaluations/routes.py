"""HTTP routes of evaluations: thin adapters over rlctl.service.evaluations.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import OPERATE, READ
from rlctl.service.deps import Ctx
from rlctl.service.evaluations import service
from rlctl.service.evaluations.schemas import EvaluationOut, EvaluationRequest
from rlctl.service.names import name_path
from rlctl.service.schemas import error_responses

router = APIRouter(prefix="/evaluations", tags=["evaluations"], responses=error_responses(401))
EvaluationId = Annotated[str, name_path("Evaluation id, as returned by POST /evaluations.")]


@router.post(
    "",
    response_model=EvaluationOut,
    status_code=202,
    summary="Evaluate a run's checkpoints against the base model",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def create_evaluation(ctx: Ctx, body: EvaluationRequest) -> EvaluationOut:
    """Sample the base model and the checkpoints on the same prompts (a dataset run's held-out split by default),
    score every completion with the same rewards, and compare: each model's mean reward, its difference to the
    base with a 95 % bootstrap interval, and its win rate per prompt. A job: poll `GET /evaluations/{id}`;
    cancel with `POST /jobs/{id}/cancel`."""
    return await run_in_threadpool(service.start_evaluation, ctx, body)


@router.get(
    "/{evaluation_id}",
    response_model=EvaluationOut,
    summary="Get an evaluation",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_evaluation(ctx: Ctx, evaluation_id: EvaluationId) -> EvaluationOut:
    """Progress (completions sampled), then the comparison and the per-prompt results."""
    return await run_in_threadpool(service.get_evaluation, ctx, evaluation_id)
