"""Run configuration: configurable vs locked fields, typed validation of edits, the merged YAML
(docs/RUNS.md#configuration).

Pure logic: no HTTP, no database, no files. Inputs are the environment's config schema (read in a child
process by the catalog), the caller's edits and the operator's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jsonschema
import yaml

from rlctl.service.environments.catalog import ConfigSchema, FieldSchema
from rlctl.service.errors import FieldLocked, UnknownField, ValidationFailed
from rlctl.service.settings import Backend, Settings
from rlctl.trainer.defaults import (
    ADVANTAGE_NORMALIZATIONS,
    DEFAULT_ADVANTAGE_NORMALIZATION,
    DEFAULT_KL_COEF,
    LOCAL_DEFAULTS,
    LOSS_FUNCTIONS,
    PPO_CLIP_HIGH,
    PPO_CLIP_LOW,
    SAMPLING_ERROR_BUDGET,
    TINKER_DEFAULTS,
    TINKER_LOSS_FUNCTIONS,
    TRAINING_ERROR_BUDGET,
)
from rlctl.trainer.health import HealthRules

BACKENDS: tuple[Backend, ...] = tuple(Backend)
DEFAULT_WANDB_PROJECT = "atropos-tinker"
# Sizes rlctl chooses when an environment's config_init() leaves them at Atropos's class defaults.
SIZE_FIELDS = ("group_size", "batch_size")
PLACEHOLDER_URL = "http://127.0.0.1:{port allocated per run}"


@dataclass(frozen=True)
class LockedField:
    name: str
    type: str
    description: str
    in_env: bool  # also written to the `env` section (the environment's config class has it)


LOCKED_FIELDS: tuple[LockedField, ...] = (
    LockedField("tokenizer_name", "str", "Tokenizer and base model the run trains.", True),
    LockedField("rollout_server_url", "str", "Atropos trajectory API; a port allocated per run.", True),
    LockedField("max_num_workers", "int", "Most rollout workers an environment runs at once.", True),
    LockedField("worker_timeout", "float", "Seconds before a rollout worker is abandoned.", True),
    LockedField("total_steps", "int", "Training steps of the run.", True),
    LockedField("steps_per_eval", "int", "Steps between evaluations.", True),
    LockedField("max_batches_offpolicy", "int", "Batches allowed in the queue ahead of training.", True),
    LockedField("inference_weight", "float", "Weight of this environment's rollouts.", True),
    LockedField("eval_limit_ratio", "float", "Share of workers kept during evaluation.", True),
    LockedField("learning_rate", "float", "Adam learning rate.", False),
    LockedField("max_token_trainer_length", "int", "Longest sequence the trainer accepts.", False),
    LockedField("save_checkpoint_interval", "int", "Steps between checkpoints.", False),
)
# What the tinker backend cannot honour (docs/TRAINER.md#training-options): locked there, never silently ignored.
TINKER_LOCKED_FIELDS: tuple[LockedField, ...] = (
    LockedField("kl_coef", "float", "KL penalty to the reference model: Tinker keeps no reference model.", False),
    LockedField("lora_alpha", "int | None", "LoRA's alpha: Tinker chooses it itself.", False),
    LockedField("keep_last_n", "int | None", "Checkpoint retention: Tinker keeps the checkpoints it saves.", False),
)
LOCKED_NAMES = frozenset(f.name for f in LOCKED_FIELDS)
# Environment fields rlctl chooses per backend unless a run edits them (the operator's value is the default).
BACKEND_ENV_FIELDS = ("max_token_length",)
# Environment fields rlctl sets itself: paths on the server and W&B switches are not a caller's to choose.
MANAGED_ENV_FIELDS = {
    "use_wandb": "On when W&B is configured on the server.",
    "data_path_to_save_groups": "Not used by supervised runs.",
    "data_dir_to_save_evals": "Not used by supervised runs.",
    # Dataset runs (docs/RUNS.md#training-on-a-dataset): files in the run directory, and the request's rewards.
    "groups_path": "The run's training groups, written when the run is created.",
    "prompts_path": "The run's training prompts, written when the run is created.",
    "held_out_path": "The run's held-out prompts, written when the run is created.",
    "rewards": "The rewards of the request's dataset source.",
    "dataset_judge": "The judge of the request's online dataset source (URL, model, rubric; never its key).",
    # A tool environment's run with a judge_rubric (docs/TOOL_ENVIRONMENTS.md#judge).
    "judge": "The service's judge for the run's judge_rubric (URL, model; never its key).",
    "answer_field": "The answer field of the request's dataset source.",
    "sft_top_n": "The request's top_n of an sft dataset run.",
}


@dataclass(frozen=True)
class ConfigurableField:
    name: str
    type: str
    default: Any
    description: str
    json_schema: dict[str, Any]


# rlctl's own fields of a run, written to the trainer's section (docs/RUNS.md#configuration).
RUN_FIELDS: tuple[ConfigurableField, ...] = (
    ConfigurableField(
        "sampling_error_budget",
        "int",
        SAMPLING_ERROR_BUDGET,
        "Consecutive failed sampling calls that fail the run (sampling_failed).",
        {"type": "integer", "minimum": 1},
    ),
    ConfigurableField(
        "training_error_budget",
        "int",
        TRAINING_ERROR_BUDGET,
        "Consecutive failed training steps that fail the run (training_failed).",
        {"type": "integer", "minimum": 1},
    ),
    ConfigurableField(
        "best_metric",
        "str",
        HealthRules().metric,
        "Trainer metric (higher is better) that ranks checkpoints and shows a collapse.",
        {"type": "string", "minLength": 1},
    ),
    ConfigurableField(
        "collapse_drop",
        "float",
        HealthRules().collapse_drop,
        "A fall of best_metric below best - collapse_drop * |best| ...",
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    ),
    ConfigurableField(
        "collapse_steps",
        "int",
        HealthRules().collapse_steps,
        "... held for this many steps in a row (or empty completions as long) flags the run collapsed.",
        {"type": "integer", "minimum": 1},
    ),
    ConfigurableField(
        "stop_on_collapse",
        "bool",
        HealthRules().stop_on_collapse,
        "End the run (failed, collapsed) once it collapses.",
        {"type": "boolean"},
    ),
)


MAX_LORA_RANK = 256


def locked_fields(backend: Backend) -> tuple[LockedField, ...]:
    """The fields a run on `backend` cannot edit."""
    return LOCKED_FIELDS + (TINKER_LOCKED_FIELDS if backend == Backend.TINKER else ())


def training_fields(settings: Settings, backend: Backend) -> tuple[ConfigurableField, ...]:
    """The training options of a run (docs/TRAINER.md#training-options), with its backend's defaults, written to
    the trainer's section. What the tinker backend cannot compute is not offered there (TINKER_LOCKED_FIELDS)."""
    chosen = settings.backend_values(backend)
    local = backend == Backend.LOCAL
    losses = LOSS_FUNCTIONS if local else TINKER_LOSS_FUNCTIONS
    defaults = LOCAL_DEFAULTS if local else TINKER_DEFAULTS
    fields = [
        ConfigurableField(
            "loss_fn",
            "str",
            defaults["loss_fn"],
            f"Policy loss: {', '.join(losses)} (gspo: a clipped ratio per sequence; cross_entropy: supervised, "
            "-advantage x logprob; both local only).",
            {"enum": list(losses)},
        ),
        ConfigurableField(
            "clip_low_threshold",
            "float",
            PPO_CLIP_LOW,
            "ppo, gspo: lower bound of the clipped probability ratio (1 - ε_low).",
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        ),
        ConfigurableField(
            "clip_high_threshold",
            "float",
            PPO_CLIP_HIGH,
            "ppo, gspo: upper bound of the clipped probability ratio (1 + ε_high).",
            {"type": "number", "minimum": 1},
        ),
        ConfigurableField(
            "advantage_normalization",
            "str",
            DEFAULT_ADVANTAGE_NORMALIZATION,
            "group_mean: reward - group mean; mean_std: that over the group's std; none: the raw reward.",
            {"enum": list(ADVANTAGE_NORMALIZATIONS)},
        ),
        ConfigurableField(
            "lora_rank",
            "int",
            chosen.lora_rank,
            "Rank of the LoRA adapter.",
            {"type": "integer", "minimum": 1, "maximum": MAX_LORA_RANK},
        ),
        ConfigurableField(
            "mask_truncated_completions",
            "bool",
            False,
            "Train completions cut by the length limit with advantage 0.",
            {"type": "boolean"},
        ),
    ]
    if local:
        fields += [
            ConfigurableField(
                "kl_coef",
                "float",
                DEFAULT_KL_COEF,
                "Weight of the KL penalty to the reference model (the base with the adapter off); 0: none.",
                {"type": "number", "minimum": 0},
            ),
            ConfigurableField(
                "lora_alpha",
                "int | None",
                None,
                "LoRA's alpha; null: twice the rank.",
                {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
            ),
            ConfigurableField(
                "keep_last_n",
                "int | None",
                None,
                "Checkpoints kept besides the best, the pinned and those in use; null: every one.",
                {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
            ),
        ]
    return tuple(fields)


@dataclass(frozen=True)
class RunPlacement:
    """Where a run lives: allocated by the supervisor, not chosen by the caller."""

    api_port: int | None = None
    inference_port: int | None = None
    run_dir: str | None = None


# W&B's own rule for project names: at most 128 characters, none of / \ # ? % : nor a control character.
WANDB_PROJECT = {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[^/\\\\#?%:\\u0000-\\u001f]+$"}


def locked_values(settings: Settings, backend: Backend) -> dict[str, Any]:
    chosen = settings.backend_values(backend)
    only_tinker: dict[str, Any] = (
        {"kl_coef": 0.0, "lora_alpha": None, "keep_last_n": None} if backend == Backend.TINKER else {}
    )
    return {
        **only_tinker,
        "tokenizer_name": chosen.base_model,
        "rollout_server_url": PLACEHOLDER_URL,
        "max_num_workers": settings.max_num_workers,
        "worker_timeout": settings.worker_timeout,
        "total_steps": chosen.total_steps,
        "steps_per_eval": chosen.steps_per_eval,
        "max_batches_offpolicy": settings.max_batches_offpolicy,
        "inference_weight": settings.inference_weight,
        "eval_limit_ratio": settings.eval_limit_ratio,
        "learning_rate": chosen.learning_rate,
        "max_token_trainer_length": chosen.max_token_trainer_length,
        "save_checkpoint_interval": chosen.save_checkpoint_interval,
    }


def configurable_fields(
    env_name: str, schema: ConfigSchema, settings: Settings, backend: Backend
) -> list[ConfigurableField]:
    fields = [
        ConfigurableField(
            "backend",
            "Literal['tinker', 'local']",
            settings.effective_default_backend.value,
            "Training backend: the Tinker service, or torch + peft on this machine.",
            {"enum": [b.value for b in BACKENDS]},
        ),
        ConfigurableField("wandb_project", "str", DEFAULT_WANDB_PROJECT, "W&B project of the run.", WANDB_PROJECT),
        *RUN_FIELDS,
        *training_fields(settings, backend),
    ]
    for field in schema.fields:
        if field.name in LOCKED_NAMES or field.name in MANAGED_ENV_FIELDS:
            continue
        default = _default_for(field, settings, backend)
        if field.name == "max_token_length":  # the operator's value: the default and the most a run may ask
            limit = settings.backend_values(backend).max_token_length
            schema_of = {**field.json_schema, "type": "integer", "minimum": 1, "maximum": limit}
            description = f"Longest sequence the environment may generate; at most {limit}."
            fields.append(ConfigurableField(field.name, "int", default, description, schema_of))
            continue
        description = field.description
        if field.name == "wandb_name":
            description = f"W&B run name; when unset, {env_name}-YYYYmmdd-HHMMSS."
        fields.append(ConfigurableField(field.name, field.type, default, description, field.json_schema))
    return fields


def validate_edits(
    edits: dict[str, Any], fields: list[ConfigurableField], schema: ConfigSchema, locked: dict[str, Any]
) -> dict[str, Any]:
    """Check every edit against its field's type and constraints; raise the first problem, listing all."""
    by_name = {f.name: f for f in fields}
    problems: list[tuple[type[ValidationFailed], dict[str, Any]]] = []
    for name, value in edits.items():
        if name in locked or name in MANAGED_ENV_FIELDS:
            shown = locked.get(name, "managed by rlctl")
            problems.append(
                (
                    FieldLocked,
                    {"field": name, "message": f"{name} is locked by the server", "locked_value": shown},
                )
            )
        elif name not in by_name:
            problems.append(
                (
                    UnknownField,
                    {
                        "field": name,
                        "message": f"unknown field {name!r}",
                        "available_fields": sorted(by_name),
                    },
                )
            )
        elif message := _type_error(value, by_name[name], schema.defs):
            problems.append((ValidationFailed, {"field": name, "message": message, "expected": by_name[name].type}))
    if not problems:
        problems.extend(_cross_field_problems({**_defaults(fields), **edits}))
    if problems:
        error_type, first = problems[0]
        raise error_type(first["message"], {**first, "errors": [p for _, p in problems]})
    return dict(edits)


def effective_values(edits: dict[str, Any], fields: list[ConfigurableField]) -> dict[str, Any]:
    return {**_defaults(fields), **edits}


def build_run_config(
    env_name: str,
    schema: ConfigSchema,
    edits: dict[str, Any],
    settings: Settings,
    placement: RunPlacement,
    now: datetime,
    wandb_enabled: bool = False,
    managed: dict[str, Any] | None = None,
    total_steps: int | None = None,
) -> dict[str, Any]:
    """The merged config: config_init() values < caller's edits < locked values, in the YAML's sections.
    `managed` gives managed fields their values (others are null); `total_steps` replaces the locked value
    where the run's data decides it (an offline dataset run's epochs)."""
    backend = Backend(edits.get("backend") or settings.effective_default_backend)
    values = effective_values(edits, configurable_fields(env_name, schema, settings, backend))
    locked = locked_values(settings, backend)
    locked["rollout_server_url"] = f"http://127.0.0.1:{placement.api_port}" if placement.api_port else PLACEHOLDER_URL
    if total_steps is not None:
        locked["total_steps"] = total_steps
    # Every run evaluates: at least twice within its steps (docs/TRAINER.md#training-options).
    locked["steps_per_eval"] = max(1, min(locked["steps_per_eval"], locked["total_steps"] // 2))
    wandb_name = values.get("wandb_name") or f"{env_name}-{now:%Y%m%d-%H%M%S}"
    inference_url = (
        f"http://127.0.0.1:{placement.inference_port}/v1" if placement.inference_port else PLACEHOLDER_URL + "/v1"
    )
    return {
        "env": _env_section(schema, values, locked, wandb_name, wandb_enabled, managed or {}),
        "openai": [
            {
                "model_name": locked["tokenizer_name"],
                "base_url": inference_url,
                "api_key": "local",  # a placeholder: the environment hook puts the run's key in (never a file)
                "server_type": "sglang",
                "health_check": False,
                "timeout": int(locked["worker_timeout"]),
            }
        ],
        "tinker": _tinker_section(backend, values, locked, placement, wandb_name),
        "slurm": False,
        "testing": False,
    }


def _env_section(
    schema: ConfigSchema,
    values: dict[str, Any],
    locked: dict[str, Any],
    wandb_name: str,
    wandb_enabled: bool,
    managed: dict[str, Any],
) -> dict[str, Any]:
    """The environment's config class's fields: its defaults < edits < locked values; managed fields rlctl sets."""
    env_field_names = {f.name for f in schema.fields}
    section = {f.name: f.default for f in schema.fields}
    section.update({k: v for k, v in values.items() if k in env_field_names})
    section.update({f.name: locked[f.name] for f in LOCKED_FIELDS if f.in_env and f.name in env_field_names})
    section["wandb_name"] = wandb_name
    for name in MANAGED_ENV_FIELDS:
        if name in env_field_names:
            section[name] = wandb_enabled if name == "use_wandb" else managed.get(name)
    return section


def _tinker_section(
    backend: Backend, values: dict[str, Any], locked: dict[str, Any], placement: RunPlacement, wandb_name: str
) -> dict[str, Any]:
    """What the trainer reads."""
    return {
        "backend": backend.value,
        "base_model": locked["tokenizer_name"],
        "learning_rate": locked["learning_rate"],
        "total_steps": locked["total_steps"],
        "batch_size": values["batch_size"],
        "group_size": values["group_size"],
        "max_token_trainer_length": locked["max_token_trainer_length"],
        "save_checkpoint_interval": locked["save_checkpoint_interval"],
        "inference_host": "127.0.0.1",
        "inference_port": placement.inference_port,
        "run_dir": placement.run_dir,
        "wandb_project": values["wandb_project"],
        "wandb_run_name": wandb_name,
        "seed": 0,
        **{field.name: values[field.name] for field in RUN_FIELDS},
        **_training_options(backend, values),
        # a dataset environment's choice (docs/RUNS.md#training-on-a-dataset); false for every other
        "normalize_advantages": bool(values.get("normalize_by_std", False)),
    }


def _training_options(backend: Backend, values: dict[str, Any]) -> dict[str, Any]:
    """The trainer's view of the training options; a dataset environment's normalize_by_std asks for mean_std
    unless the run chose a normalisation itself."""
    options = {
        name: values[name]
        for name in ("loss_fn", "clip_low_threshold", "clip_high_threshold", "lora_rank", "mask_truncated_completions")
    }
    normalization = values["advantage_normalization"]
    if normalization == DEFAULT_ADVANTAGE_NORMALIZATION and values.get("normalize_by_std"):
        normalization = "mean_std"
    options["advantage_normalization"] = normalization
    if backend == Backend.LOCAL:
        options.update(kl_coef=values["kl_coef"], lora_alpha=values["lora_alpha"], keep_last_n=values["keep_last_n"])
    return options


def render_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _defaults(fields: list[ConfigurableField]) -> dict[str, Any]:
    return {f.name: f.default for f in fields}


def _default_for(field: FieldSchema, settings: Settings, backend: Backend) -> Any:
    """config_init()'s value; rlctl's own default where config_init() left a size at Atropos's class default."""
    if field.name == "wandb_name":
        return None  # auto: {env}-{YYYYmmdd-HHMMSS}, the name the trainer logs under
    if field.name in BACKEND_ENV_FIELDS:
        return settings.backend_values(backend).max_token_length
    if field.name in SIZE_FIELDS and not field.set_by_init:
        chosen = settings.backend_values(backend)
        return chosen.group_size if field.name == "group_size" else chosen.batch_size
    return field.default


def _type_error(value: Any, field: ConfigurableField, defs: dict[str, Any]) -> str | None:
    schema = {**field.json_schema, "$defs": defs}
    schema.pop("default", None)
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return f"{field.name} expects {field.type}: {error.message}"


def _cross_field_problems(values: dict[str, Any]) -> list[tuple[type[ValidationFailed], dict[str, Any]]]:
    group, batch = values.get("group_size"), values.get("batch_size")
    if not isinstance(group, int) or not isinstance(batch, int):
        return []
    if group < 2:
        message = "group_size must be at least 2: GRPO compares rollouts within a group"
        return [(ValidationFailed, {"field": "group_size", "message": message})]
    if batch < group or batch % group:
        message = f"batch_size ({batch}) must be a positive multiple of group_size ({group}): groups are never split"
        return [(ValidationFailed, {"field": "batch_size", "message": message})]
    return []
