"""A group of rollouts of one prompt, sampled from the environment's model server and scored into the group
Atropos takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atroposlib.envs.base import BaseEnv, ScoredDataGroup
from atroposlib.envs.server_handling.openai_server import OpenAIServer

from rlctl.trajectories.training import reply_samples

# One rollout: the reply's text, prompt + reply tokens, masks (-100 on the prompt) and sampler logprobs.
Sample = tuple[str, list[int], list[int], list[float]]


async def sample_group(env: BaseEnv, messages: list[dict[str, str]], **sampling: Any) -> list[Sample]:
    """The replies to `messages` (`n` of them, with `max_tokens`, `temperature`, ...: `sampling`) as rollouts.
    A plain OpenAI endpoint (inference tests) answers text only: its replies' tokens come from the tokenizer and
    their logprobs are placeholders (`reply_samples`)."""
    if isinstance(env.server.servers[0], OpenAIServer):
        completion = await env.server.chat_completion(messages=messages, **sampling)
        replies = [choice.message.content or "" for choice in completion.choices]
        return reply_samples(env.tokenizer, messages, replies)
    async with env.server.managed_server(tokenizer=env.tokenizer) as managed:
        completion = await managed.chat_completion(messages=messages, **sampling)
        nodes = managed.get_state()["nodes"]
    return [
        (choice.message.content or "", node.tokens, node.masked_tokens, node.logprobs)
        for choice, node in zip(completion.choices, nodes, strict=True)
    ]


def scored_group(messages: list[dict[str, str]], samples: Sequence[Sample], scores: Sequence[float]) -> ScoredDataGroup:
    """The rollouts with their scores, as Atropos takes a group: each one's conversation ends in its reply."""
    group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
    for (text, tokens, masks, logprobs), score in zip(samples, scores, strict=True):
        group["tokens"].append(tokens)
        group["masks"].append(masks)
        group["scores"].append(score)
        group["inference_logprobs"].append(logprobs)
        group["messages"].append([*messages, {"role": "assistant", "content": text}])
    return group
