"""The environments' shared helpers (environment_kit): the model server config_init() names and the scored group
Atropos takes. A group's sampling runs against real servers where environments run: the run's inference server
through atroposlib's managed server in every training (tests/trainer/test_echo_pipeline.py, test_gsm8k_pipeline.py),
a plain OpenAI endpoint's text in the inference tests' child (tests/inference_tests/test_child.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.environment_kit.sampling import scored_group
from rlctl.environment_kit.servers import LOCAL_INFERENCE_URL, local_model_server, tiny_model_dir

MESSAGES = [{"role": "user", "content": "Echo: 12"}]


def test_a_scored_group_pairs_each_rollout_with_its_score_and_conversation() -> None:
    samples = [("12", [1, 2], [-100, 2], [1.0, -0.5]), ("7", [1, 3], [-100, 3], [1.0, -2.0])]
    group = scored_group(MESSAGES, samples, [1.0, 0.25])
    assert group["tokens"] == [[1, 2], [1, 3]] and group["masks"] == [[-100, 2], [-100, 3]]
    assert group["scores"] == [1.0, 0.25] and group["inference_logprobs"] == [[1.0, -0.5], [1.0, -2.0]]
    assert group["messages"] == [
        [*MESSAGES, {"role": "assistant", "content": "12"}],
        [*MESSAGES, {"role": "assistant", "content": "7"}],
    ]
    with pytest.raises(ValueError):  # a score per rollout, no fewer
        scored_group(MESSAGES, samples, [1.0])


def test_the_local_model_server_and_the_tiny_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = local_model_server("Qwen/Qwen3-8B")
    assert (server.model_name, server.base_url, server.api_key) == ("Qwen/Qwen3-8B", LOCAL_INFERENCE_URL, "local")
    assert server.server_type == "sglang" and server.health_check is False
    monkeypatch.setenv("RLCTL_DATA_DIR", str(tmp_path))
    assert tiny_model_dir() == str(tmp_path / "models" / "tiny-qwen3")
    monkeypatch.delenv("RLCTL_DATA_DIR")
    assert tiny_model_dir() == str(Path("var") / "models" / "tiny-qwen3")
