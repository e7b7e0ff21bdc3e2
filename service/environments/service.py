"""Environment catalog operations, shared by the REST routes and the agent tools."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service.context import AppContext
from service.environments import authoring
from service.environments.discovery import EnvironmentInfo
from service.environments.schemas import (
    CatalogError,
    ConfigPreview,
    ConfigurableFieldOut,
    EnvironmentDetail,
    EnvironmentList,
    EnvironmentSummary,
    LockedFieldOut,
)
from service.errors import ValidationFailed
from service.runs import config as run_config
from service.settings import Backend


def source_hash(env: EnvironmentInfo) -> str:
    """SHA-256 of the environment file as it is now: what a run records of the code it runs."""
    return authoring.source_hash(env.file_path.read_bytes())


def summary(env: EnvironmentInfo) -> EnvironmentSummary:
    return EnvironmentSummary(
        name=env.name,
        class_name=env.class_name,
        file_path=str(env.file_path),
        description=env.description,
        config_class=env.config_class,
    )


def list_environments(ctx: AppContext) -> EnvironmentList:
    environments, errors = ctx.catalog.discover()
    return EnvironmentList(
        environments=[summary(e) for e in environments],
        count=len(environments),
        errors=[CatalogError(name=e.name, file_path=str(e.file_path), error=e.error) for e in errors],
    )


def resolve_backend(ctx: AppContext, backend: str | None) -> Backend:
    chosen = backend or ctx.settings.effective_default_backend
    if chosen not in run_config.BACKENDS:
        raise ValidationFailed(
            f"unknown backend {chosen!r}", {"field": "backend", "available": list(run_config.BACKENDS)}
        )
    return Backend(chosen)


def describe_environment(ctx: AppContext, name: str, backend: Backend | None = None) -> EnvironmentDetail:
    env = ctx.catalog.get(name)
    chosen = resolve_backend(ctx, backend)
    schema = ctx.catalog.config_schema(env)
    fields = run_config.configurable_fields(env.name, schema, ctx.settings, chosen)
    locked = run_config.locked_values(ctx.settings, chosen)
    return EnvironmentDetail(
        **summary(env).model_dump(exclude={"config_class"}),
        config_class=schema.config_class,
        backend=chosen,
        configurable_fields=[
            ConfigurableFieldOut(name=f.name, type=f.type, default=f.default, description=f.description) for f in fields
        ],
        locked_fields=[
            LockedFieldOut(name=f.name, type=f.type, value=locked[f.name], description=f.description)
            for f in run_config.LOCKED_FIELDS
        ],
    )


def preview_config(ctx: AppContext, name: str, edits: dict[str, Any], backend: Backend | None = None) -> ConfigPreview:
    env = ctx.catalog.get(name)
    edits = dict(edits)
    chosen = resolve_backend(ctx, backend or edits.get("backend"))
    edits["backend"] = chosen.value
    schema = ctx.catalog.config_schema(env)
    fields = run_config.configurable_fields(env.name, schema, ctx.settings, chosen)
    run_config.validate_edits(edits, fields, schema, run_config.locked_values(ctx.settings, chosen))
    merged = run_config.build_run_config(
        env.name,
        schema,
        edits,
        ctx.settings,
        run_config.RunPlacement(),
        datetime.now(UTC),
        wandb_enabled=ctx.settings.wandb_api_key is not None,
    )
    return ConfigPreview(environment=env.name, backend=chosen, config=merged, yaml=run_config.render_yaml(merged))
