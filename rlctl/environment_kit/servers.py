"""The model an environment defaults to and the model server it names in `config_init()`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from atroposlib.envs.base import APIServerConfig, BaseEnvConfig

from rlctl.trainer.tiny_model import default_tiny_model_dir

ConfigType = TypeVar("ConfigType", bound=BaseEnvConfig)

# The inference server's address in `config_init()`; a run's YAML (`openai`, written by rlctl with the run's own
# port) and an inference test's replace the whole server entry when the environment is served.
LOCAL_INFERENCE_URL = "http://127.0.0.1:9001/v1"


def tiny_model_dir() -> str:
    """The tiny model the local backend builds in the data directory
    (docs/ARCHITECTURE.md#data-directory-rlctl_data_dir-default-var)."""
    return str(default_tiny_model_dir(Path(os.environ.get("RLCTL_DATA_DIR", "var"))))


def local_model_server(model_name: str) -> APIServerConfig:
    """The run's inference server as `config_init()` names it: tokens and logprobs come back (`sglang`)."""
    return APIServerConfig(
        model_name=model_name,
        base_url=LOCAL_INFERENCE_URL,
        api_key="local",
        server_type="sglang",
        health_check=False,
    )


def built_tiny_model(directory: Path | None = None) -> Path:
    """The tiny model in `directory` (default: the data directory's), built there first when it is not (priming
    starts from it: docs/TOOL_ENVIRONMENTS.md#priming)."""
    from rlctl.trainer.tiny_model import init_tiny_model

    return init_tiny_model(directory or Path(tiny_model_dir()))


def primed_tool_env_init(
    config_cls: type[ConfigType], model: Path, name: str
) -> tuple[ConfigType, list[APIServerConfig]]:
    """`config_init()` of a tool environment the tiny model learns from a primed copy (`model`): the settings its
    measured runs used (docs/TOOL_ENVIRONMENTS.md), a group of 8 episodes per task, 4 tasks a step, 24 steps."""
    settings: dict[str, Any] = {
        "tokenizer_name": str(model),
        "group_size": 8,
        "batch_size": 32,
        "total_steps": 24,
        "steps_per_eval": 1000,
        "max_token_length": 1024,  # the tools' schemas in the system turn, one token a character for the tiny model
        "use_wandb": False,
        "wandb_name": name,
        "ensure_scores_are_not_same": False,  # as echo: the trainer skips solved groups itself
    }
    return config_cls(**settings), [local_model_server(str(model))]
