"""Tools to read and write environment code: the same service functions and models as the REST routes.

Writing is `admin` (the code runs with the service's privileges, docs/AUTH.md#scopes).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlctl.service.auth.scopes import Scope
from rlctl.service.context import AppContext
from rlctl.service.environments import authoring
from rlctl.service.environments.schemas import EnvironmentSource, EnvironmentWritten, WriteEnvironmentRequest
from rlctl.service.names import NAME_PATTERN
from rlctl.service.tools.registry import Hints, Tool, ToolArguments
from rlctl.service.tools.sessions import SessionState


class ReadEnvironmentArgs(ToolArguments):
    name: str = Field(pattern=NAME_PATTERN, description="Environment name, e.g. echo.")


class WriteEnvironmentArgs(WriteEnvironmentRequest, ToolArguments):
    name: str = Field(pattern=NAME_PATTERN, description="Environment name; the class's `name` must equal it.")
    if_match: str | None = Field(
        None,
        max_length=200,
        description="The hash rl_read_environment returned, so a change made meanwhile is not overwritten.",
    )


def read_environment(ctx: AppContext, _state: SessionState, args: ReadEnvironmentArgs) -> EnvironmentSource:
    return authoring.read_source(ctx, args.name)


def write_environment(ctx: AppContext, _state: SessionState, args: WriteEnvironmentArgs) -> EnvironmentWritten:
    request = WriteEnvironmentRequest(source=args.source)
    return authoring.write_environment(ctx, args.name, request, args.if_match)


ENVIRONMENT_TOOLS: tuple[Tool[Any], ...] = (
    Tool(
        "rl_read_environment",
        "Read an environment's Python source and its hash (shipped or written through rlctl), to learn how "
        "environments build prompts and score rollouts, or to change one.",
        ReadEnvironmentArgs,
        EnvironmentSource,
        read_environment,
        Hints(read_only=True, idempotent=True),
        scope=Scope.READ,
    ),
    Tool(
        "rl_write_environment",
        "Create or replace an environment from Python source: one BaseEnv subclass whose `name` is the given "
        "name (not a shipped environment's). It is stored only when it parses and imports (its config schema "
        "is read in a child process); else the result has `validation` with the failed check (line for a "
        "syntax error, traceback tail for an import error). Pass if_match (the hash you read) when replacing. "
        "Then select it with rl_select_environment and test it with rl_test_inference before training.",
        WriteEnvironmentArgs,
        EnvironmentWritten,
        write_environment,
        Hints(idempotent=True),
        scope=Scope.ADMIN,
    ),
)
