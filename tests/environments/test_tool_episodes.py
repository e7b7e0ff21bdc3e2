"""Multi-turn tool episodes (rlctl/environment_kit/agents.py, tool_env.py) with the tiny model's real tokenizer and
chat template. The policy here is a scripted sampler (the replies are given, their logprobs made up): what is
checked is the conversation the episode builds around them, the masks, the tools and the rewards. Sampling from a
real model server is the agentic pipeline's test (tests/trainer/test_agentic_pipeline.py)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from environments.tool_lookup import demonstration, looked_up, lookup_task
from rlctl.environment_kit.agents import (
    MASKED,
    Sampled,
    Template,
    ToolCallFailed,
    coalesced,
    episode_metrics,
    run_episode,
)
from rlctl.environment_kit.answers import answer_is_value
from rlctl.environment_kit.priming import assistant_masked
from rlctl.environment_kit.tool_env import EpisodeToolbox, SandboxTools, Tool, ToolTask, compose, task_schemas
from rlctl.sandbox.errors import SandboxUnavailable
from rlctl.trainer.tiny_model import build_tokenizer
from rlctl.trajectories.tool_calls import ParsedToolCall
from tests.support.sandbox import required_sandbox

CALL = '\n<tool_call>\n{"name": "lookup", "arguments": {"key": "code"}}\n</tool_call>'


@pytest.fixture(scope="module")
def template() -> Template:
    return Template(build_tokenizer())


def scripted(template: Template, replies: Sequence[str], cut: int | None = None):
    """A sampler answering `replies` in turn, each ended by the end token (unless longer than max_tokens)."""
    tokenizer, queue = template.tokenizer, list(replies)
    prompts: list[list[int]] = []

    async def sample(input_ids: list[int], max_tokens: int) -> Sampled:
        prompts.append(list(input_ids))
        tokens = tokenizer.encode(queue.pop(0), add_special_tokens=False) + [tokenizer.eos_token_id]
        if len(tokens) > max_tokens:
            return Sampled(tokens[:max_tokens], [-0.5] * max_tokens, "length")
        return Sampled(tokens, [-0.5] * len(tokens), "stop")

    return sample, prompts


def episode_on(template: Template, replies: Sequence[str], max_turns: int = 3, max_tokens: int = 2048):
    task = lookup_task(random.Random(0), "code", 3)
    tools = {tool.name: tool for tool in task.tools}

    async def run_tool(call: ParsedToolCall) -> str:
        if call.name not in tools:
            raise ToolCallFailed(f"no tool named {call.name!r}")
        return await tools[call.name](call.arguments)

    sample, prompts = scripted(template, replies)
    schemas = [tool.schema() for tool in task.tools]
    episode = asyncio.run(
        run_episode(
            template,
            task.messages,
            schemas,
            sample,
            run_tool,
            max_turns=max_turns,
            max_reply_tokens=96,
            max_tokens=max_tokens,
        )
    )
    return task, episode, prompts


def test_an_episode_is_the_chat_templates_conversation_with_only_the_policys_tokens_trained(
    template: Template,
) -> None:
    task, episode, prompts = episode_on(template, [CALL, "It is VALUE."])
    value = task.data["value"]
    tokenizer = template.tokenizer
    final = "It is VALUE."
    conversation = [
        *task.messages,
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": value},
        {"role": "assistant", "content": final},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=[t.schema() for t in task.tools], tokenize=False)
    assert tokenizer.decode(episode.tokens) + "\n" == rendered  # token extension: the template's own text
    trained = tokenizer.decode(
        [token for token, mask in zip(episode.tokens, episode.masks, strict=True) if mask != MASKED]
    )
    assert trained == CALL + "<|im_end|>" + final + "<|im_end|>"  # replies and their end tokens only
    assert [mask for mask in episode.masks if mask != MASKED] == [
        token for token, mask in zip(episode.tokens, episode.masks, strict=True) if mask != MASKED
    ]
    assert all(logprob == 1.0 for logprob, mask in zip(episode.logprobs, episode.masks, strict=True) if mask == MASKED)
    assert all(logprob == -0.5 for logprob, mask in zip(episode.logprobs, episode.masks, strict=True) if mask != MASKED)
    assert prompts[1] == episode.tokens[: len(prompts[1])]  # the second turn extended the first's tokens
    assert tokenizer.decode(prompts[1]).endswith(f"<|im_start|>tool\n{value}<|im_end|>\n<|im_start|>assistant\n")
    assert (episode.stats.turns, episode.stats.tool_calls, episode.stats.failed_calls) == (2, 1, 0)
    assert not episode.stats.truncated
    assert answer_is_value(task, episode) == 0.0  # "VALUE" is not the value
    assert looked_up(task, episode) == 1.0  # but the call returned it


def test_the_answer_is_rewarded_and_failed_calls_are_shown_to_the_policy(template: Template) -> None:
    task, episode, prompts = episode_on(template, [CALL.replace('"code"', '"door"'), CALL, "VALUE"])
    value = task.data["value"]
    assert "no value under 'door'" in template.tokenizer.decode(prompts[1])
    assert (episode.stats.turns, episode.stats.tool_calls, episode.stats.failed_calls) == (3, 2, 1)
    right = episode_on(template, [CALL, f"The code is {value}"])[1]
    assert answer_is_value(task, right) == 1.0
    assert answer_is_value(task, episode_on(template, [f"0123456789 {value}"])[1]) == 0.0  # listing every digit
    assert looked_up(task, episode_on(template, [CALL.replace('"code"', '"door"'), "1"])[1]) == 0.0  # failed call
    metrics = episode_metrics([episode, right])
    assert metrics["agent/turns_per_episode"] == 2.5 and metrics["agent/tool_calls_per_episode"] == 1.5
    assert metrics["agent/failed_call_share"] == pytest.approx(1 / 3)
    assert compose([(answer_is_value, 0.5), (lambda _t, e: float(e.stats.turns), 0.1)], task, right) == 0.7


def test_max_turns_and_max_tokens_truncate(template: Template) -> None:
    _, episode, _ = episode_on(template, [CALL, CALL, CALL], max_turns=2)
    assert episode.stats.turns == 2 and episode.stats.tool_calls == 1 and episode.stats.truncated
    task = lookup_task(random.Random(0), "code", 3)
    limit = len(template.prompt(task.messages, [tool.schema() for tool in task.tools])) + 20  # 20 tokens of reply
    _, short, _ = episode_on(template, [CALL], max_tokens=limit)
    assert short.stats.truncated and len(short.tokens) <= limit
    assert short.masks[-1] != MASKED  # cut in its reply: the sampled tokens stay, nothing follows them


def test_a_tool_checks_its_arguments_and_reports_its_errors() -> None:
    tool = Tool(
        "add", "Add.", {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"]}, lambda a, b=0: a + b
    )
    assert asyncio.run(tool({"a": 2, "b": 3})) == "5"
    for arguments, message in (
        ({"c": 1, "a": 1}, "unknown argument"),
        ({}, "missing argument"),
        ({"a": "x", "b": 1}, "TypeError"),
    ):
        with pytest.raises(ToolCallFailed, match=message):
            asyncio.run(tool(arguments))


def test_the_collections_sandboxed_tools_run_in_one_kept_sandbox_per_episode(tmp_path: Path) -> None:
    required_sandbox()  # the tools find the sandbox themselves: this fails (CI) or skips where there is none
    tools = SandboxTools(timeout_s=5)
    assert [schema["function"]["name"] for schema in tools.schemas()] == ["terminal", "read_file", "write_file"]
    task = ToolTask(messages=[], tools=[tools, Tool("add", "Add.", {"type": "object", "properties": {}}, lambda: 1)])
    assert [schema["function"]["name"] for schema in task_schemas(task)][-1] == "add"
    with pytest.raises(ValueError, match="sandbox tools"):
        SandboxTools(names=("browser",))

    async def episode() -> tuple[dict, ...]:
        toolbox = EpisodeToolbox(tools, tmp_path / "sandbox", files={"given/seed.txt": "42"})
        assert not (tmp_path / "sandbox").exists()  # no call yet: no sandbox
        bound = toolbox.bound()
        try:
            wrote = json.loads(await bound["write_file"]({"path": "f.txt", "content": "hi\n"}))
            ran = json.loads(await bound["terminal"]({"command": "cat f.txt && echo more >> f.txt && ls /root"}))
            read = json.loads(await bound["read_file"]({"path": "f.txt"}))
            given = json.loads(await bound["terminal"]({"command": "cat given/seed.txt"}))
            with pytest.raises(ToolCallFailed, match="timed out") as timed_out:
                await bound["terminal"]({"command": "sleep 30"})
            with pytest.raises(ToolCallFailed, match="outside the working directory"):
                await bound["read_file"]({"path": "../outside.txt"})
        finally:
            await toolbox.close()
        return wrote, ran, read, given, json.loads(timed_out.value.result)

    wrote, ran, read, given, timed_out = asyncio.run(episode())
    assert given["output"] == "42"  # the task's files are in the work directory before its first call
    assert wrote["written_bytes"] == 3
    assert ran["output"].startswith("hi\n") and ran["exit_code"] != 0  # /root is not in the sandbox's view
    assert read["content"] == "hi\nmore\n"  # the same work directory for every call of the episode
    assert "timed out" in timed_out["error"] and "output" in timed_out  # the policy sees the whole result


def test_priming_learns_only_the_assistant_turns() -> None:
    import random

    tokenizer = build_tokenizer()
    messages, tools = demonstration(random.Random(0), "code", 3)
    tokens, labels = assistant_masked(tokenizer, messages, tools)
    assert tokenizer.decode(tokens) == tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    learned = tokenizer.decode([label for label in labels if label != MASKED])
    value = messages[2]["content"]
    assert learned == CALL + "<|im_end|>\n" + value + "<|im_end|>\n"


def test_the_file_tools_run_without_a_sandbox_where_none_can_be_made(tmp_path: Path) -> None:
    """As a collection's: confined by the work directory's checks; `terminal` alone needs the sandbox."""
    absent = "rlctl-test-no-such-bwrap"

    async def episode() -> tuple[dict, dict]:
        toolbox = EpisodeToolbox(SandboxTools(names=("read_file", "write_file"), bwrap=absent), tmp_path / "files")
        bound = toolbox.bound()
        try:
            wrote = json.loads(await bound["write_file"]({"path": "a.txt", "content": "7"}))
            read = json.loads(await bound["read_file"]({"path": "a.txt"}))
            with pytest.raises(ToolCallFailed, match="outside the working directory"):
                await bound["read_file"]({"path": "/etc/hostname"})
        finally:
            await toolbox.close()
        return wrote, read

    wrote, read = asyncio.run(episode())
    assert wrote["written_bytes"] == 1 and read["content"] == "7"
    with pytest.raises(SandboxUnavailable, match="not installed"):
        SandboxTools(names=("terminal",), bwrap=absent).open(tmp_path / "shell")


def test_a_groups_common_first_turn_goes_out_as_one_request_of_n_rows() -> None:
    """`coalesced`: what a group's episodes ask in the same pass of the event loop with the same prompt is one
    request of n rows, its replies handed out in order; other prompts go alone, and a failure reaches every caller."""
    calls: list[tuple[list[int], int, int]] = []

    async def sample_n(input_ids: list[int], max_tokens: int, n: int) -> list[Sampled]:
        calls.append((input_ids, max_tokens, n))
        await asyncio.sleep(0)
        if input_ids == [9]:
            raise RuntimeError("the server is gone")
        return [Sampled([input_ids[-1], row], [-0.5, -0.5], "stop") for row in range(n)]

    async def group() -> tuple[list[Sampled], Sampled, list[BaseException | Sampled]]:
        sample = coalesced(sample_n)
        first = await asyncio.gather(*(sample([1, 2], 8) for _ in range(4)))
        later = await sample([1, 2], 8)  # asked alone, later: a request of its own
        failed = await asyncio.gather(sample([9], 8), sample([9], 8), return_exceptions=True)
        return first, later, failed

    first, later, failed = asyncio.run(group())
    assert calls == [([1, 2], 8, 4), ([1, 2], 8, 1), ([9], 8, 2)]
    assert [reply.tokens for reply in first] == [[2, 0], [2, 1], [2, 2], [2, 3]]
    assert later.tokens == [2, 0]
    assert all(isinstance(error, RuntimeError) for error in failed)

    async def mixed() -> None:
        sample = coalesced(sample_n)
        await asyncio.gather(sample([1], 4), sample([2], 4), sample([1], 4), sample([1], 5))

    calls.clear()
    asyncio.run(mixed())
    assert sorted(calls) == [([1], 4, 2), ([1], 5, 1), ([2], 4, 1)]
