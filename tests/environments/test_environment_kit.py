"""The environments' shared helpers (environment_kit): the model server config_init() names, a group's sampling
from the run's server or a plain OpenAI endpoint, and the scored group Atropos takes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from atroposlib.envs.server_handling.openai_server import OpenAIServer

from rlctl.environment_kit.sampling import sample_group, scored_group
from rlctl.environment_kit.servers import LOCAL_INFERENCE_URL, local_model_server, tiny_model_dir
from rlctl.trainer.tiny_model import build_tokenizer
from rlctl.trajectories.training import reply_samples

MESSAGES = [{"role": "user", "content": "Echo: 12"}]
SAMPLING = {"n": 2, "max_tokens": 4, "temperature": 1.0}


def completion(*replies: str | None) -> SimpleNamespace:
    return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=reply)) for reply in replies])


class ManagedServer:
    """atroposlib's managed server as an environment sees it: a completion, then the nodes it tracked."""

    def __init__(self, nodes: list[SimpleNamespace]) -> None:
        self.nodes = nodes
        self.asked: dict[str, Any] = {}

    async def chat_completion(self, **asked: Any) -> SimpleNamespace:
        self.asked = asked
        return completion("12", None)

    def get_state(self) -> dict[str, Any]:
        return {"nodes": self.nodes}


def test_a_group_from_the_runs_server_keeps_its_tokens_masks_and_logprobs() -> None:
    nodes = [SimpleNamespace(tokens=[1, 2, 3], masked_tokens=[-100, 2, 3], logprobs=[1.0, -0.5, -0.25])] * 2
    managed = ManagedServer(nodes)
    tokenizers: list[Any] = []

    @contextlib.asynccontextmanager
    async def managed_server(tokenizer: Any) -> AsyncIterator[ManagedServer]:
        tokenizers.append(tokenizer)
        yield managed

    tokenizer = object()
    server = SimpleNamespace(servers=[object()], managed_server=managed_server)
    env = SimpleNamespace(server=server, tokenizer=tokenizer)
    samples = asyncio.run(sample_group(env, MESSAGES, **SAMPLING))  # type: ignore[arg-type]
    assert managed.asked == {"messages": MESSAGES, **SAMPLING} and tokenizers == [tokenizer]
    assert samples == [
        ("12", [1, 2, 3], [-100, 2, 3], [1.0, -0.5, -0.25]),
        ("", [1, 2, 3], [-100, 2, 3], [1.0, -0.5, -0.25]),  # a reply without content is the empty text
    ]


def test_a_plain_openai_endpoint_gives_its_replies_as_rollouts_of_the_tokenizer() -> None:
    asked: dict[str, Any] = {}

    async def chat_completion(**arguments: Any) -> SimpleNamespace:
        asked.update(arguments)
        return completion("12", "It is 12.")

    tokenizer = build_tokenizer()
    plain = OpenAIServer.__new__(OpenAIServer)  # only its type matters: text only, no tokens or logprobs
    env = SimpleNamespace(server=SimpleNamespace(servers=[plain], chat_completion=chat_completion), tokenizer=tokenizer)
    samples = asyncio.run(sample_group(env, MESSAGES, **SAMPLING))  # type: ignore[arg-type]
    assert asked == {"messages": MESSAGES, **SAMPLING}
    assert samples == reply_samples(tokenizer, MESSAGES, ["12", "It is 12."])


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
