"""FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.context import AppContext


def get_context(request: Request) -> AppContext:
    return request.app.state.context


Ctx = Annotated[AppContext, Depends(get_context)]
