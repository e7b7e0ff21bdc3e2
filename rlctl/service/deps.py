"""FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from rlctl.service.context import AppContext


async def get_context(request: Request) -> AppContext:
    # async on purpose: FastAPI runs a plain `def` dependency in a worker thread, a hop per request for nothing.
    return context_of(request)


def context_of(request: Request) -> AppContext:
    """The app's context, for a route that takes the request instead of `Ctx`: the runs' two hottest reads, where
    resolving the dependency was a twentieth of a record's CPU (benchmarks/read_cpu.py)."""
    context: AppContext = request.app.state.context
    return context


Ctx = Annotated[AppContext, Depends(get_context)]
