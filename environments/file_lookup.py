"""File lookup: the code is in `code.txt` of the episode's sandbox, beside a decoy `guess.txt`; read the right file
with the collections' own `read_file` tool and answer with what it holds. The multi-turn tool task of the agentic
loop's proof: a checkpoint trained on it is the agent of a collection offering `read_file`, which renders the same
prompt (docs/TOOL_ENVIRONMENTS.md#file_lookup).

    python environments/file_lookup.py prime               # the primed tiny model, once (about 20 s of CPU)
    python environments/file_lookup.py serve --config RUN.yaml

Each task writes a random `digits`-digit value to `code.txt` and another to `guess.txt` in the episode's work
directory (the sandbox's, rlctl/sandbox/toolbox.py). The reward is half for a `read_file` call that returned the
value and half for a final answer whose first number is the value. The tiny random model never writes a tool call
by chance, so its base is a briefly primed copy (`prime`, rlctl/environment_kit/priming.py) that reads one of the
two files in nearly every episode, `guess.txt` about as often as `code.txt`: which file to read is what RL raises.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from atroposlib.envs.base import APIServerConfig
from pydantic import Field

from rlctl.environment_kit.agents import Episode
from rlctl.environment_kit.answers import answer_is_value
from rlctl.environment_kit.servers import built_tiny_model, primed_tool_env_init
from rlctl.environment_kit.tool_env import SandboxTools, ToolEnv, ToolEnvConfig, ToolTask

DIGITS = "0123456789"
CODE_FILE, DECOY_FILE = "code.txt", "guess.txt"
TOOLS = SandboxTools(names=("read_file",))
PROMPT = f"What is the code? Read {CODE_FILE}."
PRIMED_SUBDIR = Path("models") / "tiny-qwen3-file_lookup"
# Primed on as many reads of the decoy as of the code: the format is learnt, the choice of file left to RL.
PRIMING_STEPS, PRIMING_LEARNING_RATE = 150, 1e-2


def read_the_code(task: ToolTask, episode: Episode) -> float:
    """1 when a `read_file` call returned the code's file content: credited once however often it reads."""
    for call, result, failed in episode.tool_results:
        if call.name == "read_file" and not failed and json.loads(result).get("content") == task.data["value"]:
            return 1.0
    return 0.0


class FileLookupConfig(ToolEnvConfig):
    digits: int = Field(1, ge=1, le=16, description="Digits of each task's value.")


def file_task(rng: random.Random, digits: int) -> ToolTask:
    value = "".join(rng.choice(DIGITS) for _ in range(digits))
    decoy = value
    while decoy == value:
        decoy = "".join(rng.choice(DIGITS) for _ in range(digits))
    return ToolTask(
        messages=[{"role": "user", "content": PROMPT}],
        tools=[TOOLS],
        data={"value": value, "decoy": decoy},
        files={CODE_FILE: value, DECOY_FILE: decoy},
    )


def demonstration(rng: random.Random, digits: int, path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A task as a conversation that reads `path` and answers with its content, for priming; the tool turn is the
    toolbox's own result text."""
    task = file_task(rng, digits)
    content = task.files[path]
    call = {"type": "function", "function": {"name": "read_file", "arguments": {"path": path}}}
    messages = [
        *task.messages,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": json.dumps({"content": content, "truncated": False}), "name": "read_file"},
        {"role": "assistant", "content": content},
    ]
    return messages, TOOLS.schemas()


def primed_model_dir() -> Path:
    return Path(os.environ.get("RLCTL_DATA_DIR", "var")) / PRIMED_SUBDIR


def prime_model(
    output: Path | None = None, base: Path | None = None, steps: int = PRIMING_STEPS, seed: int = 0
) -> Path:
    """The tiny model primed on file lookups, half of them reading the decoy (built once; see
    rlctl/environment_kit/priming.py)."""
    from rlctl.environment_kit.priming import prime

    base = built_tiny_model(base)
    digits = FileLookupConfig.model_fields["digits"].default
    rng = random.Random(seed + 7)
    conversations = [demonstration(rng, digits, (CODE_FILE, DECOY_FILE)[index % 2]) for index in range(512)]
    return prime(
        base, output or primed_model_dir(), conversations, steps=steps, learning_rate=PRIMING_LEARNING_RATE, seed=seed
    )


class FileLookupEnv(ToolEnv):
    """Read code.txt, not the decoy, in the sandbox and answer with it: a multi-turn tool task the tiny model
    learns with the collections' own tool."""

    name = "file_lookup"
    env_config_cls = FileLookupConfig
    rewards = ((read_the_code, 0.5), (answer_is_value, 0.5))

    def __init__(self, config: FileLookupConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: FileLookupConfig = config

    @classmethod
    def config_init(cls) -> tuple[FileLookupConfig, list[APIServerConfig]]:
        return primed_tool_env_init(FileLookupConfig, primed_model_dir(), "file_lookup")

    def next_task(self, rng: random.Random) -> ToolTask:
        return file_task(rng, self.config.digits)


if __name__ == "__main__":
    if sys.argv[1:2] == ["prime"]:
        print(prime_model())
    else:
        FileLookupEnv.cli()
