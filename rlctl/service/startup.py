"""The composition root's first half: the context with the domains' components, and the start-up work.

Light to import on purpose: `rlctl serve` builds the context and begins the start-up work (children) before it
imports the app's modules, which takes seconds (docs/RUNS.md#start-up-work). rlctl/service/app.py builds the rest.
"""

from __future__ import annotations

from rlctl.service.context import AppContext, WarmUpWork, build_context
from rlctl.service.environments.catalog import EnvironmentCatalog, child_process_environment
from rlctl.service.runs.tiny_model import TinyModelBuilder
from rlctl.service.settings import SECRET_ENV_NAMES, Backend, Settings


def build_app_context(settings: Settings) -> AppContext:
    """The kernel's context, with the environment catalog and the tiny model's builder provided."""
    context = build_context(settings)

    def child_environment() -> dict[str, str]:
        return child_process_environment(set(SECRET_ENV_NAMES))

    context.provide(
        EnvironmentCatalog(
            directories=lambda: settings.environment_directories,
            schema_timeout_s=settings.schema_timeout_s,
            child_environment=child_environment,
            store_dir=settings.schema_store_dir,
            children=context.children,
            scrub=context.scrub,
        )
    )
    context.provide(TinyModelBuilder(settings.tiny_model_dir, context.children, child_environment))
    return context


def start_up_work(context: AppContext) -> WarmUpWork:
    """Every environment's config schema, and the local backend's tiny model when it is the default backend's
    model and not built yet."""
    settings = context.settings
    work: WarmUpWork = [("environment schemas", EnvironmentCatalog.of(context).warm)]
    tiny_model = TinyModelBuilder.of(context)
    uses_tiny_model = settings.effective_default_backend == Backend.LOCAL and not settings.local_base_model
    if uses_tiny_model and not tiny_model.built():
        work.append(("tiny model", tiny_model.ensure))
    return work
