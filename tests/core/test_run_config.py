"""Run configuration: defaults, typed validation of edits, the merged YAML (pure logic)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml

from rlctl.service.environments import run_config
from rlctl.service.environments.catalog import ConfigSchema, FieldSchema
from rlctl.service.errors import FieldLocked, UnknownField, ValidationFailed
from rlctl.service.settings import Settings

SCHEMA = ConfigSchema(
    config_class="DemoConfig",
    fields=(
        FieldSchema("group_size", "int", 16, "", {"type": "integer"}),
        FieldSchema("batch_size", "int", 128, "", {"type": "integer"}),
        FieldSchema("total_steps", "int", 1000, "", {"type": "integer"}),
        FieldSchema("tokenizer_name", "str", "x", "", {"type": "string"}),
        FieldSchema("rollout_server_url", "str", "http://localhost:8000", "", {"type": "string"}),
        FieldSchema("use_wandb", "bool", True, "", {"type": "boolean"}),
        FieldSchema("wandb_name", "str | None", "demo", "", {"anyOf": [{"type": "string"}, {"type": "null"}]}),
        FieldSchema("temperature", "float", 1.0, "", {"type": "number", "minimum": 0, "maximum": 2}),
        FieldSchema("mode", "Mode", "fast", "", {"$ref": "#/$defs/Mode"}),
        FieldSchema("max_token_length", "int", 2048, "", {"type": "integer"}),
        FieldSchema("steps_per_eval", "int", 100, "", {"type": "integer"}),
    ),
    defs={"Mode": {"enum": ["fast", "slow"], "type": "string"}},
)


@pytest.fixture
def settings() -> Settings:
    return Settings(_env_file=None, data_dir="/tmp/rlctl-config-test")


def fields(settings: Settings, backend: str = "tinker") -> list[run_config.ConfigurableField]:
    return run_config.configurable_fields("demo", SCHEMA, settings, backend)  # type: ignore[arg-type]


def validate(settings: Settings, edits: dict, backend: str = "tinker") -> dict:
    locked = run_config.locked_values(settings, backend)  # type: ignore[arg-type]
    return run_config.validate_edits(edits, fields(settings, backend), SCHEMA, locked)


def test_locked_defaults_match_the_spec(settings: Settings) -> None:
    values = run_config.locked_values(settings, "tinker")
    assert values["tokenizer_name"] == "Qwen/Qwen3-8B"
    assert values["max_num_workers"] == 2048
    assert values["worker_timeout"] == 3600
    assert values["total_steps"] == 2500
    assert values["steps_per_eval"] == 25
    assert values["max_batches_offpolicy"] == 3
    assert values["inference_weight"] == 1.0
    assert values["eval_limit_ratio"] == 0.1
    assert values["learning_rate"] == 4e-5
    assert values["max_token_trainer_length"] == 9000
    assert values["save_checkpoint_interval"] == 25


def test_locked_fields_come_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCTL_TOTAL_STEPS", "77")
    monkeypatch.setenv("RLCTL_LORA_RANK", "4")
    values = run_config.locked_values(Settings(_env_file=None), "tinker")
    assert values["total_steps"] == 77
    # lora_rank is a run's to choose; the operator's value is its default
    assert {f.name: f.default for f in fields(Settings(_env_file=None))}["lora_rank"] == 4


def test_configurable_fields_exclude_locked_and_managed_ones(settings: Settings) -> None:
    names = [f.name for f in fields(settings)]
    assert names[:2] == ["backend", "wandb_project"]
    assert "total_steps" not in names and "tokenizer_name" not in names and "use_wandb" not in names
    assert {"group_size", "batch_size", "temperature", "mode", "wandb_name"} <= set(names)


def test_defaults_are_config_init_values_and_wandb_name_is_auto(settings: Settings) -> None:
    defaults = {f.name: f.default for f in fields(settings)}
    assert defaults["group_size"] == 16
    assert defaults["temperature"] == 1.0
    assert defaults["wandb_name"] is None
    assert defaults["wandb_project"] == "atropos-tinker"


def test_valid_edits_pass(settings: Settings) -> None:
    edits = {"group_size": 8, "batch_size": 64, "temperature": 0.5, "mode": "slow", "wandb_name": "x"}
    assert validate(settings, edits) == edits


@pytest.mark.parametrize(
    ("edits", "error", "code"),
    [
        ({"total_steps": 10}, FieldLocked, "FIELD_LOCKED"),
        ({"use_wandb": True}, FieldLocked, "FIELD_LOCKED"),
        ({"no_such_field": 1}, UnknownField, "UNKNOWN_FIELD"),
        ({"group_size": "8"}, ValidationFailed, "VALIDATION_ERROR"),
        ({"group_size": True}, ValidationFailed, "VALIDATION_ERROR"),
        ({"group_size": 2.5}, ValidationFailed, "VALIDATION_ERROR"),
        ({"temperature": 3.0}, ValidationFailed, "VALIDATION_ERROR"),
        ({"mode": "medium"}, ValidationFailed, "VALIDATION_ERROR"),
        ({"group_size": 1, "batch_size": 4}, ValidationFailed, "VALIDATION_ERROR"),
        ({"group_size": 8, "batch_size": 12}, ValidationFailed, "VALIDATION_ERROR"),
        ({"backend": "gpu"}, ValidationFailed, "VALIDATION_ERROR"),
    ],
)
def test_bad_edits_get_distinct_errors(settings: Settings, edits: dict, error: type, code: str) -> None:
    with pytest.raises(error) as caught:
        validate(settings, edits)
    assert caught.value.code == code
    assert caught.value.details["field"] in edits


def test_locked_error_names_the_locked_value(settings: Settings) -> None:
    with pytest.raises(FieldLocked) as caught:
        validate(settings, {"total_steps": 10})
    assert caught.value.details["locked_value"] == 2500


def test_unknown_field_lists_the_available_ones(settings: Settings) -> None:
    with pytest.raises(UnknownField) as caught:
        validate(settings, {"gruop_size": 8})
    assert "group_size" in caught.value.details["available_fields"]


def test_merged_config_layers_init_edits_and_locked_values(settings: Settings) -> None:
    placement = run_config.RunPlacement(api_port=18000, inference_port=18001, run_dir="/data/runs/r1")
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    merged = run_config.build_run_config(
        "demo", SCHEMA, {"backend": "tinker", "group_size": 8, "batch_size": 64}, settings, placement, now
    )
    assert set(merged) == {"env", "openai", "tinker", "slurm", "testing"}
    env = merged["env"]
    assert env["group_size"] == 8 and env["batch_size"] == 64
    assert env["temperature"] == 1.0  # config_init value kept
    assert env["total_steps"] == 2500 and env["tokenizer_name"] == "Qwen/Qwen3-8B"  # locked win
    assert env["rollout_server_url"] == "http://127.0.0.1:18000"
    assert env["wandb_name"] == "demo-20261130-120000"
    assert env["use_wandb"] is False
    [server] = merged["openai"]
    assert server["base_url"] == "http://127.0.0.1:18001/v1" and server["server_type"] == "sglang"
    tinker = merged["tinker"]
    assert tinker["wandb_run_name"] == env["wandb_name"]
    assert tinker["lora_rank"] == 32 and tinker["learning_rate"] == 4e-5
    assert tinker["batch_size"] == 64 and tinker["group_size"] == 8
    assert yaml.safe_load(run_config.render_yaml(merged)) == merged


def test_local_backend_has_its_own_locked_values(settings: Settings) -> None:
    values = run_config.locked_values(settings, "local")
    assert values["tokenizer_name"] == str(settings.tiny_model_dir)
    assert values["learning_rate"] == settings.local_learning_rate
    assert values["total_steps"] == settings.local_total_steps


def test_training_options_default_to_the_seeds_recipe(settings: Settings) -> None:
    tinker = {f.name: f.default for f in fields(settings, "tinker")}
    local = {f.name: f.default for f in fields(settings, "local")}
    assert tinker["loss_fn"] == "importance_sampling" and local["loss_fn"] == "ppo"
    assert tinker["lora_rank"] == 32 and local["lora_rank"] == 8
    assert tinker["max_token_length"] == 8192 and local["max_token_length"] == 512
    assert local["advantage_normalization"] == "group_mean" and local["kl_coef"] == 0.0
    assert local["lora_alpha"] is None and local["mask_truncated_completions"] is False
    assert "kl_coef" not in tinker and "lora_alpha" not in tinker


def test_training_options_reach_the_trainer(settings: Settings) -> None:
    edits = {
        "backend": "local",
        "loss_fn": "gspo",
        "clip_low_threshold": 0.9,
        "clip_high_threshold": 1.1,
        "advantage_normalization": "none",
        "kl_coef": 0.05,
        "lora_rank": 4,
        "lora_alpha": 16,
        "mask_truncated_completions": True,
        "max_token_length": 256,
    }
    assert validate(settings, edits, "local") == edits
    merged = run_config.build_run_config(
        "demo", SCHEMA, edits, settings, run_config.RunPlacement(), datetime(2026, 1, 1, tzinfo=UTC)
    )
    tinker = merged["tinker"]
    assert {key: tinker[key] for key in edits if key not in ("backend", "max_token_length")} == {
        key: value for key, value in edits.items() if key not in ("backend", "max_token_length")
    }
    assert merged["env"]["max_token_length"] == 256


@pytest.mark.parametrize(
    ("edits", "error", "code"),
    [
        ({"kl_coef": 0.1}, FieldLocked, "FIELD_LOCKED"),
        ({"lora_alpha": 16}, FieldLocked, "FIELD_LOCKED"),
        ({"keep_last_n": 2}, FieldLocked, "FIELD_LOCKED"),
        ({"loss_fn": "gspo"}, ValidationFailed, "VALIDATION_ERROR"),
        ({"advantage_normalization": "batch"}, ValidationFailed, "VALIDATION_ERROR"),
        ({"clip_low_threshold": 1.5}, ValidationFailed, "VALIDATION_ERROR"),
        ({"clip_high_threshold": 0.5}, ValidationFailed, "VALIDATION_ERROR"),
        ({"lora_rank": 0}, ValidationFailed, "VALIDATION_ERROR"),
        ({"max_token_length": 100_000}, ValidationFailed, "VALIDATION_ERROR"),
    ],
)
def test_tinker_refuses_what_it_cannot_honour(settings: Settings, edits: dict, error: type, code: str) -> None:
    with pytest.raises(error) as caught:
        validate(settings, edits, "tinker")
    assert caught.value.code == code and caught.value.details["field"] in edits


def test_the_tinker_lock_names_why(settings: Settings) -> None:
    with pytest.raises(FieldLocked) as caught:
        validate(settings, {"kl_coef": 0.1}, "tinker")
    assert caught.value.details["locked_value"] == 0.0
    names = [f.name for f in run_config.locked_fields("tinker")]  # type: ignore[arg-type]
    assert "kl_coef" in names and "lora_alpha" in names
    assert "kl_coef" not in [f.name for f in run_config.locked_fields("local")]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("backend", "total_steps", "expected"), [("local", None, 20), ("local", 10, 5), ("tinker", 30, 15)]
)
def test_every_run_evaluates(settings: Settings, backend: str, total_steps: int | None, expected: int) -> None:
    merged = run_config.build_run_config(
        "demo",
        SCHEMA,
        {"backend": backend},
        settings,
        run_config.RunPlacement(),
        datetime(2026, 1, 1, tzinfo=UTC),
        total_steps=total_steps,
    )
    steps = merged["tinker"]["total_steps"]
    assert merged["env"]["steps_per_eval"] == expected and merged["env"]["steps_per_eval"] <= steps // 2
