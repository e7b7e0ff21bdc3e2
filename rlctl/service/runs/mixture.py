"""Mixed runs: several environments on one run's trajectory API, each with a weight (docs/RUNS.md#mixed-environments).

Atropos lets several environments register with one trajectory API; each registers with a weight
(`inference_weight`), and the API gives each its share of the inference capacity by that weight, so its share of
the groups in the batches follows. The first environment is the run's own (its record's `environment`, the
trainer's group and batch sizes); every environment's config is the run's `config` with its own edits over it,
checked as a single-environment run's would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.environments import run_config
from rlctl.service.environments import service as environments
from rlctl.service.errors import ServiceError, ValidationFailed
from rlctl.service.runs.datasets import DATASET_ENVIRONMENTS
from rlctl.service.runs.schemas import EnvironmentShare
from rlctl.service.runs.tool_judge import managed_judge
from rlctl.service.settings import Backend

MIXTURE_KEY = "mixture"  # the merged config's section of a mixed run


@dataclass(frozen=True)
class Member:
    share: EnvironmentShare
    plan: environments.RunConfigPlan


def plan_members(
    ctx: AppContext, shares: Sequence[EnvironmentShare], shared_edits: dict[str, Any], backend: Backend
) -> list[Member]:
    """Each environment's config plan; the first problem is raised naming the environment by its index."""
    members = []
    for index, share in enumerate(shares):
        field = f"environments[{index}]"
        if share.name in DATASET_ENVIRONMENTS.values():
            raise ValidationFailed(
                f"{share.name} trains on a dataset and cannot be mixed", {"field": f"{field}.name", "value": share.name}
            )
        try:
            plan = environments.plan_run_config(ctx, share.name, {**shared_edits, **share.config}, backend)
        except ServiceError as error:
            error.details = {**error.details, "environment_index": index}
            raise
        members.append(Member(share, plan))
    _same_group_size(members)
    return members


def _same_group_size(members: list[Member]) -> None:
    """The trainer takes one group size (the first environment's): a group of another size would train with a
    different baseline per prompt, so every environment must have the same."""
    first = members[0].plan.values()["group_size"]
    for index, member in enumerate(members[1:], start=1):
        size = member.plan.values()["group_size"]
        if size != first:
            raise ValidationFailed(
                f"every mixed environment needs the same group_size: {member.share.name} has {size}, "
                f"{members[0].share.name} {first}",
                {"field": f"environments[{index}].config.group_size", "expected": first, "value": size},
            )


def mixture_section(
    ctx: AppContext,
    members: list[Member],
    primary: dict[str, Any],
    placement: run_config.RunPlacement,
    wandb_enabled: bool,
) -> list[dict[str, Any]]:
    """Each environment's name, weight, metric prefix and `env` section (the first's is the run's own)."""
    section = []
    for index, member in enumerate(members):
        if index == 0:
            env = primary["env"]
        else:
            env = member.plan.merge(ctx, placement, wandb_enabled, managed=managed_judge(ctx, member.plan))["env"]
        env = {**env, "inference_weight": member.share.weight}
        if "wandb_name" in env:
            env["wandb_name"] = f"{env['wandb_name']}-{index}"
        section.append(
            {
                "name": member.share.name,
                "weight": member.share.weight,
                "prefix": metric_prefix(index, member),
                "env": env,
            }
        )
    return section


def metric_prefix(index: int, member: Member) -> str:
    """Where an environment's own metrics are copied: `env/0.echo/train/percent_correct`."""
    return f"env/{index}.{member.share.name}/"


def member_config_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"config.env{index}.yaml"


def write_member_configs(config: dict[str, Any], run_dir: Path) -> None:
    """One YAML per environment: the run's config with that environment's `env` section."""
    for index, member in enumerate(config.get(MIXTURE_KEY) or []):
        document = {key: value for key, value in config.items() if key != MIXTURE_KEY}
        document["env"] = member["env"]
        member_config_path(run_dir, index).write_text(run_config.render_yaml(document))


def summary(config: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """A mixed run's environments as its record shows them; None for a run of one environment."""
    members = (config or {}).get(MIXTURE_KEY)
    if not members:
        return None
    return [{"name": m["name"], "weight": m["weight"], "metric_prefix": m["prefix"]} for m in members]


def launch_members(
    config: dict[str, Any] | None, run_dir: Path, environment_file_for: Any
) -> list[tuple[Path, Path, str]] | None:
    """(environment file, its config, its metric prefix) for each environment of a mixed run; None otherwise."""
    members = (config or {}).get(MIXTURE_KEY)
    if not members:
        return None
    return [
        (environment_file_for(member["name"]), member_config_path(run_dir, index), member["prefix"])
        for index, member in enumerate(members)
    ]
