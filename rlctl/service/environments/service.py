"""Environment catalog operations, shared by the REST routes and the agent tools."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.environments import authoring, run_config
from rlctl.service.environments.catalog import ConfigSchema, EnvironmentCatalog
from rlctl.service.environments.discovery import EnvironmentInfo
from rlctl.service.environments.schemas import (
    DATASET_ONLY,
    CatalogError,
    ConfigPreview,
    ConfigurableFieldOut,
    EnvironmentDetail,
    EnvironmentList,
    EnvironmentSummary,
    LockedFieldOut,
)
from rlctl.service.errors import ValidationFailed
from rlctl.service.settings import Backend


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
        trainable_by_name=env.name not in DATASET_ONLY,
    )


def list_environments(ctx: AppContext) -> EnvironmentList:
    environments, errors = EnvironmentCatalog.of(ctx).discover()
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
    env = EnvironmentCatalog.of(ctx).get(name)
    chosen = resolve_backend(ctx, backend)
    schema = EnvironmentCatalog.of(ctx).config_schema(env)
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
            for f in run_config.locked_fields(chosen)
        ],
    )


@dataclass(frozen=True)
class RunConfigPlan:
    """An environment's run configuration for one backend, with the caller's edits checked: what a run's create,
    the config preview and an inference test each read edits through (docs/RUNS.md#configuration)."""

    environment: EnvironmentInfo
    schema: ConfigSchema
    backend: Backend
    fields: list[run_config.ConfigurableField]
    edits: dict[str, Any]

    def values(self) -> dict[str, Any]:
        """Every configurable field's value: its default unless edited."""
        return run_config.effective_values(self.edits, self.fields)

    def merge(
        self,
        ctx: AppContext,
        placement: run_config.RunPlacement,
        wandb_enabled: bool,
        managed: dict[str, Any] | None = None,
        total_steps: int | None = None,
    ) -> dict[str, Any]:
        """The merged run config (run_config.build_run_config), named now."""
        return run_config.build_run_config(
            self.environment.name,
            self.schema,
            self.edits,
            ctx.settings,
            placement,
            datetime.now(UTC),
            wandb_enabled,
            managed=managed,
            total_steps=total_steps,
        )


def plan_run_config(
    ctx: AppContext,
    environment: str,
    edits: dict[str, Any],
    backend: Backend | str | None = None,
    set_by_caller: Collection[str] = (),
) -> RunConfigPlan:
    """Resolve the environment and backend and check `edits` against its fields (the schema is read in a child
    the first time). The chosen backend is one of the edits, unless the caller sets `backend` itself; fields in
    `set_by_caller` are not editable."""
    env = EnvironmentCatalog.of(ctx).get(environment)
    chosen = resolve_backend(ctx, backend or edits.get("backend"))
    schema = EnvironmentCatalog.of(ctx).config_schema(env)
    fields = run_config.configurable_fields(env.name, schema, ctx.settings, chosen)
    fields = [field for field in fields if field.name not in set_by_caller]
    checked = dict(edits) if "backend" in set_by_caller else {**edits, "backend": chosen.value}
    run_config.validate_edits(checked, fields, schema, run_config.locked_values(ctx.settings, chosen))
    return RunConfigPlan(env, schema, chosen, fields, checked)


def preview_config(ctx: AppContext, name: str, edits: dict[str, Any], backend: Backend | None = None) -> ConfigPreview:
    plan = plan_run_config(ctx, name, edits, backend)
    wandb_enabled = ctx.settings.wandb_api_key is not None
    merged = plan.merge(ctx, run_config.RunPlacement(), wandb_enabled)
    return ConfigPreview(
        environment=plan.environment.name, backend=plan.backend, config=merged, yaml=run_config.render_yaml(merged)
    )
