"""The model an environment defaults to and the model server it names in `config_init()`."""

from __future__ import annotations

import os
from pathlib import Path

from atroposlib.envs.base import APIServerConfig

from rlctl.trainer.tiny_model import default_tiny_model_dir

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
