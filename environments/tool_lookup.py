"""Tool lookup: of two tools, call `lookup(key)` (the right one) rather than `guess()`, then answer with what it
returned. A multi-turn tool task the tiny local model learns online (docs/TOOL_ENVIRONMENTS.md#tool_lookup).

    python environments/tool_lookup.py prime               # the primed tiny model, once (about 20 s of CPU)
    python environments/tool_lookup.py serve --config RUN.yaml

Each task hides a random `digits`-digit value behind the environment's one key; `guess()` returns another value.
An episode: the policy calls a tool (pure Python), reads the result in the tool turn, and answers. The reward is half
for a call of `lookup` that returned the value and half for a final answer whose first number is the value. The tiny
random model never writes a tool call by chance, so its base is a briefly primed copy (`prime`,
rlctl/environment_kit/priming.py) that calls one of the two tools in nearly every episode, `guess` about two times in
three, and answers with what the tool returned now and then: choosing the tool the prompt names is what RL raises
(measured: docs/TOOL_ENVIRONMENTS.md#tool_lookup).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

from atroposlib.envs.base import APIServerConfig
from pydantic import Field

from rlctl.environment_kit.agents import Episode, ToolCallFailed
from rlctl.environment_kit.answers import answer_is_value
from rlctl.environment_kit.servers import built_tiny_model, primed_tool_env_init
from rlctl.environment_kit.tool_env import Tool, ToolEnv, ToolEnvConfig, ToolTask, task_schemas

DIGITS = "0123456789"
PRIMED_SUBDIR = Path("models") / "tiny-qwen3-tool_lookup-choice"  # a new name when the design changes
# Primed on as many `guess` as `lookup` demonstrations: the format is learnt, the choice of tool left to RL.
PRIMING_STEPS, PRIMING_LEARNING_RATE = 150, 1e-2


def looked_up(task: ToolTask, episode: Episode) -> float:
    """1 when a call of `lookup` returned the value (the right key): the step the answer depends on, credited
    once however often it is called, so calling again earns nothing."""
    return 1.0 if any(call.name == "lookup" and not failed for call, _, failed in episode.tool_results) else 0.0


def lookup_tool(stored_key: str, value: str) -> Tool:
    def lookup(key: str) -> str:
        if key != stored_key:
            raise ToolCallFailed(f"no value under {key!r}")
        return value

    return Tool(
        name="lookup",
        description="Return the value stored under a key.",
        parameters={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        function=lookup,
    )


class ToolLookupConfig(ToolEnvConfig):
    key: str = Field("code", min_length=1, max_length=32, description="The key every task's value is stored under.")
    digits: int = Field(1, ge=1, le=16, description="Digits of each task's value.")


def guess_tool(decoy: str) -> Tool:
    """The decoy: a tool that answers with a wrong value, so which tool the policy calls decides the reward."""
    return Tool(
        name="guess",
        description="A guess.",
        parameters={"type": "object", "properties": {}},
        function=lambda: decoy,
    )


def _digits(rng: random.Random, digits: int) -> str:
    return "".join(rng.choice(DIGITS) for _ in range(digits))


def lookup_task(rng: random.Random, key: str, digits: int) -> ToolTask:
    value = _digits(rng, digits)
    decoy = _digits(rng, digits)
    while decoy == value:
        decoy = _digits(rng, digits)
    messages = [{"role": "user", "content": f"What is the {key}? Use lookup."}]
    tools = [lookup_tool(key, value), guess_tool(decoy)]
    return ToolTask(messages=messages, tools=tools, data={"value": value, "decoy": decoy})


def demonstration(
    rng: random.Random, key: str, digits: int, tool: str = "lookup"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A task as a conversation that calls `tool` and answers with its result, for priming."""
    task = lookup_task(rng, key, digits)
    result = task.data["value" if tool == "lookup" else "decoy"]
    arguments = {"key": key} if tool == "lookup" else {}
    call = {"type": "function", "function": {"name": tool, "arguments": arguments}}
    messages = [
        *task.messages,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": result, "name": tool},
        {"role": "assistant", "content": result},
    ]
    return messages, task_schemas(task)


def primed_model_dir() -> Path:
    return Path(os.environ.get("RLCTL_DATA_DIR", "var")) / PRIMED_SUBDIR


def prime_model(
    output: Path | None = None, base: Path | None = None, steps: int = PRIMING_STEPS, seed: int = 0
) -> Path:
    """The tiny model primed on lookup tasks, half of them answered through `guess` (built once; see
    rlctl/environment_kit/priming.py)."""
    from rlctl.environment_kit.priming import prime

    base = built_tiny_model(base)
    defaults = ToolLookupConfig.model_fields
    rng = random.Random(seed + 7)
    key, digits = defaults["key"].default, defaults["digits"].default
    conversations = [demonstration(rng, key, digits, ("lookup", "guess")[index % 2]) for index in range(512)]
    return prime(
        base, output or primed_model_dir(), conversations, steps=steps, learning_rate=PRIMING_LEARNING_RATE, seed=seed
    )


class ToolLookupEnv(ToolEnv):
    """Call lookup(key), not guess(), for a hidden value and answer with it: a multi-turn tool task the tiny model
    learns."""

    name = "tool_lookup"
    env_config_cls = ToolLookupConfig
    rewards = ((looked_up, 0.5), (answer_is_value, 0.5))

    def __init__(self, config: ToolLookupConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: ToolLookupConfig = config

    @classmethod
    def config_init(cls) -> tuple[ToolLookupConfig, list[APIServerConfig]]:
        return primed_tool_env_init(ToolLookupConfig, primed_model_dir(), "tool_lookup")

    def next_task(self, rng: random.Random) -> ToolTask:
        return lookup_task(rng, self.config.key, self.config.digits)


if __name__ == "__main__":
    if sys.argv[1:2] == ["prime"]:
        print(prime_model())
    else:
        ToolLookupEnv.cli()
