"""The trainer's view of the merged run YAML: the `tinker` section plus `env.rollout_server_url`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlctl.trainer.defaults import (
    ADVANTAGE_NORMALIZATIONS,
    DEFAULT_KL_COEF,
    LOCAL_DEFAULTS,
    LORA_ALPHA_PER_RANK,
    LOSS_FUNCTIONS,
    PPO_CLIP_HIGH,
    PPO_CLIP_LOW,
    SAMPLERS,
    SAMPLING_ERROR_BUDGET,
    TINKER_DEFAULTS,
    TINKER_LOSS_FUNCTIONS,
    TRAINING_ERROR_BUDGET,
)
from rlctl.trainer.grpo import PolicyLoss
from rlctl.trainer.health import HealthRules

BACKENDS = ("local", "tinker")
TINKER_PROTOCOLS = ("auto", "current", "legacy")  # see rlctl/trainer/backends/tinker_protocol.py
# `/batch` is a cheap loopback call, and a local step takes about 0.1 s: polling every 0.2 s would add up to two
# steps' time to each wait for a batch.
BATCH_POLL_INTERVAL_S = 0.05


class ConfigError(ValueError):
    """The run YAML is missing something the trainer needs, or has a value of the wrong kind."""


@dataclass(frozen=True)
class TrainerConfig:
    backend: str
    protocol: str
    base_model: str | None
    tokenizer_name: str | None
    lora_rank: int
    learning_rate: float
    loss_fn: str
    clip_low_threshold: float
    clip_high_threshold: float
    total_steps: int
    batch_size: int
    group_size: int
    max_token_trainer_length: int
    save_checkpoint_interval: int
    inference_host: str
    inference_port: int
    run_dir: Path
    data_dir: Path
    rollout_server_url: str
    wandb_project: str
    wandb_run_name: str
    wandb_group: str
    seed: int
    device: str
    waiting_report_interval_s: float
    batch_poll_interval_s: float
    sampling_error_budget: int  # consecutive failed sampling calls that fail the run (docs/TRAINER.md)
    training_error_budget: int  # consecutive failed training steps that fail the run
    health: HealthRules  # best checkpoint and collapse detection (docs/TRAINER.md#run-health)
    normalize_advantages: bool = False  # divide each group's advantages by its reward std (dataset runs may ask)
    # Training options (docs/TRAINER.md#training-options); None: from normalize_advantages.
    advantage_normalization: str | None = None
    kl_coef: float = DEFAULT_KL_COEF
    lora_alpha: int | None = None  # None: LORA_ALPHA_PER_RANK × lora_rank
    mask_truncated_completions: bool = False
    sampler: str = "thread"  # local backend: sampling in a process of its own or a thread (docs/TRAINER.md)
    # A warm start (docs/TRAINER.md#checkpoints-and-resume): another run's checkpoint (a local directory or tinker://
    # state path) whose weights, not optimiser state, start this run when it has no checkpoint of its own.
    init_from: str | None = None
    mixed_environments: int = 0  # a mixed run's environments (docs/RUNS.md#mixed-environments); 0: one
    keep_last_n: int | None = None  # local: checkpoints kept besides the best, pinned and in use; None: all

    @property
    def effective_lora_alpha(self) -> int:
        return self.lora_alpha if self.lora_alpha is not None else LORA_ALPHA_PER_RANK * self.lora_rank

    @property
    def loss(self) -> PolicyLoss:
        return PolicyLoss(self.loss_fn, self.clip_low_threshold, self.clip_high_threshold)

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"


def _typed(section: dict[str, Any], key: str, kind: type, default: Any = ..., *, where: str = "tinker") -> Any:
    value = section.get(key, default)
    if value is ...:
        raise ConfigError(f"missing required key {where}.{key}")
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}.{key} must be {kind.__name__}, got {value!r}")
    return value


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"tinker.{name} must be positive, got {value}")


def parse_config(document: dict[str, Any]) -> TrainerConfig:
    """Build the trainer config from the merged YAML document, with backend defaults for absent keys."""
    tinker = document.get("tinker")
    if not isinstance(tinker, dict):
        raise ConfigError("the run YAML has no `tinker` section")
    env = document.get("env") or {}
    backend = _typed(tinker, "backend", str, "local")
    if backend not in BACKENDS:
        raise ConfigError(f"tinker.backend must be one of {BACKENDS}, got {backend!r}")
    defaults = LOCAL_DEFAULTS if backend == "local" else TINKER_DEFAULTS
    protocol = _typed(tinker, "protocol", str, "auto")
    if protocol not in TINKER_PROTOCOLS:
        raise ConfigError(f"tinker.protocol must be one of {TINKER_PROTOCOLS}, got {protocol!r}")
    rollout_server_url = _typed(tinker, "rollout_server_url", str, None) or _typed(
        env, "rollout_server_url", str, where="env"
    )
    run_dir = Path(_typed(tinker, "run_dir", str)).resolve()
    data_dir = _typed(tinker, "data_dir", str, None) or os.environ.get("RLCTL_DATA_DIR") or "var"
    wandb_run_name = _typed(tinker, "wandb_run_name", str, None) or env.get("wandb_name") or run_dir.name
    config = TrainerConfig(
        backend=backend,
        protocol=protocol,
        base_model=_typed(tinker, "base_model", str, defaults["base_model"]),
        tokenizer_name=_typed(env, "tokenizer_name", str, None, where="env"),
        lora_rank=_typed(tinker, "lora_rank", int, defaults["lora_rank"]),
        learning_rate=_typed(tinker, "learning_rate", float, defaults["learning_rate"]),
        loss_fn=_typed(tinker, "loss_fn", str, defaults["loss_fn"]),
        clip_low_threshold=_typed(tinker, "clip_low_threshold", float, PPO_CLIP_LOW),
        clip_high_threshold=_typed(tinker, "clip_high_threshold", float, PPO_CLIP_HIGH),
        total_steps=_typed(tinker, "total_steps", int, defaults["total_steps"]),
        batch_size=_typed(tinker, "batch_size", int, defaults["batch_size"]),
        group_size=_typed(tinker, "group_size", int, defaults["group_size"]),
        max_token_trainer_length=_typed(tinker, "max_token_trainer_length", int, defaults["max_token_trainer_length"]),
        save_checkpoint_interval=_typed(tinker, "save_checkpoint_interval", int, defaults["save_checkpoint_interval"]),
        inference_host=_typed(tinker, "inference_host", str, "127.0.0.1"),
        inference_port=_typed(tinker, "inference_port", int),
        run_dir=run_dir,
        data_dir=Path(data_dir).resolve(),
        rollout_server_url=rollout_server_url.rstrip("/"),
        wandb_project=_typed(tinker, "wandb_project", str, "atropos-tinker"),
        wandb_run_name=str(wandb_run_name),
        wandb_group=_typed(tinker, "wandb_group", str, None) or str(wandb_run_name),
        seed=_typed(tinker, "seed", int, 0),
        device=_typed(tinker, "device", str, "auto"),
        waiting_report_interval_s=_typed(tinker, "waiting_report_interval_s", float, 10.0),
        batch_poll_interval_s=_typed(tinker, "batch_poll_interval_s", float, BATCH_POLL_INTERVAL_S),
        sampling_error_budget=_typed(tinker, "sampling_error_budget", int, SAMPLING_ERROR_BUDGET),
        training_error_budget=_typed(tinker, "training_error_budget", int, TRAINING_ERROR_BUDGET),
        health=_health_rules(tinker),
        normalize_advantages=_typed(tinker, "normalize_advantages", bool, False),
        mixed_environments=len(document.get("mixture") or []),
        advantage_normalization=_typed(tinker, "advantage_normalization", str, None),
        kl_coef=_typed(tinker, "kl_coef", float, DEFAULT_KL_COEF),
        lora_alpha=_typed(tinker, "lora_alpha", int, None),
        mask_truncated_completions=_typed(tinker, "mask_truncated_completions", bool, False),
        sampler=_typed(tinker, "sampler", str, "thread"),
        init_from=_typed(tinker, "init_from", str, None),
        keep_last_n=_typed(tinker, "keep_last_n", int, None),
    )
    for name in ("lora_rank", "learning_rate", "total_steps", "batch_size", "group_size"):
        _positive(name, getattr(config, name))
    names = ("max_token_trainer_length", "save_checkpoint_interval", "waiting_report_interval_s")
    for name in (*names, "sampling_error_budget", "training_error_budget"):
        _positive(name, getattr(config, name))
    if config.sampler not in SAMPLERS:
        raise ConfigError(f"tinker.sampler must be one of {SAMPLERS}, got {config.sampler!r}")
    if config.loss_fn not in LOSS_FUNCTIONS:
        raise ConfigError(f"tinker.loss_fn must be one of {LOSS_FUNCTIONS}, got {config.loss_fn!r}")
    if not 0 < config.clip_low_threshold <= 1 <= config.clip_high_threshold:
        raise ConfigError("tinker.clip_low_threshold and clip_high_threshold must bound 1: 0 < low <= 1 <= high")
    _check_options(config)
    return config


def _check_options(config: TrainerConfig) -> None:
    """The training options' values, and what the tinker backend cannot honour: refused, never ignored."""
    if config.advantage_normalization not in (None, *ADVANTAGE_NORMALIZATIONS):
        raise ConfigError(
            f"tinker.advantage_normalization must be one of {ADVANTAGE_NORMALIZATIONS}, "
            f"got {config.advantage_normalization!r}"
        )
    if config.kl_coef < 0:
        raise ConfigError(f"tinker.kl_coef must be at least 0, got {config.kl_coef}")
    if config.lora_alpha is not None:
        _positive("lora_alpha", config.lora_alpha)
    if config.keep_last_n is not None:
        _positive("keep_last_n", config.keep_last_n)
    if config.backend != "tinker":
        return
    if config.loss_fn not in TINKER_LOSS_FUNCTIONS:
        raise ConfigError(f"the tinker backend has no loss {config.loss_fn!r}: one of {TINKER_LOSS_FUNCTIONS}")
    if config.kl_coef:
        raise ConfigError("the tinker backend has no reference model: tinker.kl_coef must be 0")
    if config.lora_alpha is not None:
        raise ConfigError("the tinker backend chooses LoRA's alpha itself: tinker.lora_alpha must be unset")
    if config.keep_last_n is not None:
        raise ConfigError("Tinker keeps the tinker backend's checkpoints: tinker.keep_last_n must be unset")


def _health_rules(tinker: dict[str, Any]) -> HealthRules:
    defaults = HealthRules()
    rules = HealthRules(
        metric=_typed(tinker, "best_metric", str, defaults.metric),
        collapse_drop=_typed(tinker, "collapse_drop", float, defaults.collapse_drop),
        collapse_steps=_typed(tinker, "collapse_steps", int, defaults.collapse_steps),
        stop_on_collapse=_typed(tinker, "stop_on_collapse", bool, defaults.stop_on_collapse),
    )
    if not 0 < rules.collapse_drop <= 1:
        raise ConfigError(f"tinker.collapse_drop must be in (0, 1], got {rules.collapse_drop}")
    _positive("collapse_steps", rules.collapse_steps)
    return rules


def load_config(path: Path) -> TrainerConfig:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read run YAML {path}: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"run YAML {path} is not a mapping")
    return parse_config(document)
