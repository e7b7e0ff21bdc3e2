"""The trainer's reading of the merged run YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.trainer.config import ConfigError, parse_config
from rlctl.trainer.defaults import LOCAL_DEFAULTS


def document(**tinker: object) -> dict:
    return {
        "env": {"rollout_server_url": "http://127.0.0.1:8000/", "tokenizer_name": "/models/tiny"},
        "tinker": {"run_dir": "/tmp/run-1", "inference_port": 9001, **tinker},
    }


def test_local_backend_fills_absent_keys_with_its_locked_defaults() -> None:
    config = parse_config(document())
    assert config.backend == "local"
    assert config.base_model is None  # the tiny model in the data directory
    assert config.learning_rate == LOCAL_DEFAULTS["learning_rate"]
    assert config.total_steps == LOCAL_DEFAULTS["total_steps"]
    assert (config.batch_size, config.group_size) == (
        LOCAL_DEFAULTS["batch_size"],
        LOCAL_DEFAULTS["group_size"],
    )
    assert config.rollout_server_url == "http://127.0.0.1:8000"
    assert config.tokenizer_name == "/models/tiny"
    assert config.run_dir == Path("/tmp/run-1")
    assert config.loss.name == "ppo" and (config.loss.clip_low, config.loss.clip_high) == (0.8, 1.2)
    assert config.sampler == "thread" and parse_config(document(sampler="process")).sampler == "process"


def test_tinker_backend_uses_the_operator_defaults() -> None:
    config = parse_config(document(backend="tinker", learning_rate=1))
    assert config.base_model == "Qwen/Qwen3-8B" and config.lora_rank == 32
    assert config.learning_rate == 1.0  # an int where a float is expected is fine
    assert config.protocol == "auto"  # detected from the server
    assert parse_config(document(backend="tinker", protocol="legacy")).protocol == "legacy"
    assert config.loss.name == "importance_sampling" and config.loss.tinker_config() is None
    clipped = parse_config(document(backend="tinker", loss_fn="ppo", clip_low_threshold=0.9, clip_high_threshold=1.1))
    assert clipped.loss.tinker_config() == {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backend": "gpu"}, "tinker.backend"),
        ({"protocol": "0.25"}, "tinker.protocol must be one of"),
        ({"total_steps": "ten"}, "tinker.total_steps must be int"),
        ({"total_steps": 0}, "must be positive"),
        ({"inference_port": None}, "missing required key tinker.inference_port"),
        ({"loss_fn": "dro"}, "tinker.loss_fn must be one of"),
        ({"clip_low_threshold": 1.1}, "must bound 1"),
        ({"clip_high_threshold": 0.5}, "must bound 1"),
        ({"sampler": "gpu"}, "tinker.sampler must be one of"),
    ],
)
def test_bad_values_are_reported_by_key(change: dict, message: str) -> None:
    doc = document(**change)
    if change.get("inference_port", 1) is None:
        del doc["tinker"]["inference_port"]
    with pytest.raises(ConfigError, match=message):
        parse_config(doc)


def test_missing_sections_are_reported() -> None:
    with pytest.raises(ConfigError, match="no `tinker` section"):
        parse_config({"env": {}})
    with pytest.raises(ConfigError, match="env.rollout_server_url"):
        parse_config({"tinker": {"run_dir": "/tmp/r", "inference_port": 1}})


def test_training_options_are_read_with_the_seeds_defaults() -> None:
    config = parse_config(document())
    assert (config.advantage_normalization, config.kl_coef, config.lora_alpha) == (None, 0.0, None)
    assert config.effective_lora_alpha == 2 * config.lora_rank and config.mask_truncated_completions is False
    chosen = parse_config(
        document(loss_fn="gspo", kl_coef=0.1, lora_alpha=32, advantage_normalization="none", lora_rank=4)
    )
    assert (chosen.loss.name, chosen.kl_coef, chosen.effective_lora_alpha) == ("gspo", 0.1, 32)
    assert chosen.advantage_normalization == "none" and chosen.lora_rank == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"loss_fn": "gspo"}, "no loss 'gspo'"),
        ({"kl_coef": 0.1}, "no reference model"),
        ({"lora_alpha": 16}, "chooses LoRA's alpha"),
        ({"keep_last_n": 2}, "keeps the tinker backend's checkpoints"),
    ],
)
def test_the_tinker_backend_refuses_what_it_cannot_honour(options: dict, message: str) -> None:
    """Never ignored: a YAML asking Tinker for a loss, a KL penalty or an alpha it has not fails to load."""
    with pytest.raises(ConfigError, match=message):
        parse_config(document(backend="tinker", **options))


@pytest.mark.parametrize(
    "options", [{"advantage_normalization": "batch"}, {"kl_coef": -1.0}, {"lora_alpha": 0}, {"loss_fn": "dapo"}]
)
def test_bad_training_options_are_refused(options: dict) -> None:
    with pytest.raises(ConfigError):
        parse_config(document(**options))
