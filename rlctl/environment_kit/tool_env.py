"""The base of multi-turn tool environments (docs/TOOL_ENVIRONMENTS.md).

An author subclasses `ToolEnv` and writes three things: `next_task()` (a `ToolTask`: the opening messages and the
tools of one task), and `rewards` (weighted reward functions of the task and the finished episode, composed into
the score). Everything else is here: a group of `group_size` episodes per task (GRPO compares episodes of the same
task), each a conversation of up to `max_turns` replies (`agents.py`), the Atropos group with only the policy's
tokens trained, and the per-turn statistics logged as run metrics (`agent/...`).

Tools are pure-Python callables (`Tool`), or shell commands run in the bubblewrap sandbox collections use, with its
limits (`ShellTool`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from rlctl.environment_kit.agents import (
    Episode,
    Sampler,
    Template,
    ToolCallFailed,
    episode_metrics,
    run_episode,
    run_group,
    server_sampler,
)
from rlctl.sandbox.bubblewrap import require_sandbox
from rlctl.sandbox.commands import run_command
from rlctl.sandbox.errors import SandboxError
from rlctl.trajectories.tool_calls import ParsedToolCall


@dataclass(frozen=True)
class Tool:
    """A tool the policy may call: `function(**arguments)` returns its result (text, or anything JSON
    serialisable); raising ToolCallFailed (or ValueError, TypeError, KeyError) fails the call with that message."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    function: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """OpenAI's tool format, as chat templates render it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def __call__(self, arguments: dict[str, Any]) -> str:
        allowed = set(self.parameters.get("properties", {}))
        unknown = set(arguments) - allowed
        if unknown:
            raise ToolCallFailed(f"unknown argument(s) of {self.name}: {', '.join(sorted(unknown))}")
        missing = set(self.parameters.get("required", [])) - set(arguments)
        if missing:
            raise ToolCallFailed(f"missing argument(s) of {self.name}: {', '.join(sorted(missing))}")
        try:
            result = self.function(**arguments)
            if inspect.isawaitable(result):
                result = await result
        except ToolCallFailed:
            raise
        except (ValueError, TypeError, KeyError) as error:
            raise ToolCallFailed(f"{type(error).__name__}: {error}") from None
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


@dataclass(frozen=True)
class ShellTool:
    """`terminal(command)`: a shell command run in the collections' bubblewrap sandbox (no network, their limits),
    in a fresh work directory per episode. Its result is `{exit_code, output, truncated}` (and `error`)."""

    name: str = "terminal"
    description: str = "Run a bash command in a sandboxed working directory; returns its exit code and output."
    timeout_s: float = 10.0
    output_limit: int = 2000
    bwrap: str = "bwrap"
    sandbox_uid: int = 65534

    @property
    def parameters(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}

    def schema(self) -> dict[str, Any]:
        return Tool(self.name, self.description, self.parameters, lambda: None).schema()

    def bind(self, workdir: Path) -> Tool:
        """The tool of one episode, running in `workdir`."""
        sandbox = require_sandbox(self.bwrap, self.sandbox_uid)
        sandbox.prepare(workdir)

        def terminal(command: str) -> dict[str, Any]:
            if not isinstance(command, str) or not command.strip() or "\x00" in command:
                raise ToolCallFailed("command must be a non-empty string without NUL")
            try:
                ran = run_command(sandbox, workdir, command, self.timeout_s, self.output_limit)
            except SandboxError as error:
                raise ToolCallFailed(f"the sandbox could not be started: {error}") from None
            result: dict[str, Any] = {"exit_code": ran.exit_code, "output": ran.output, "truncated": ran.truncated}
            if ran.timed_out:
                result["error"] = f"timed out after {self.timeout_s:g} s"
            if ran.memory_exceeded:
                result["error"] = "the command went over its memory limit and was killed"
            return result

        async def threaded(command: str) -> dict[str, Any]:  # a sandboxed call blocks: off the event loop
            return await asyncio.to_thread(terminal, command)

        return Tool(self.name, self.description, self.parameters, threaded)


@dataclass
class ToolTask:
    """One task: the conversation's opening `messages`, its `tools`, and whatever the rewards check (`data`)."""

    messages: list[dict[str, Any]]
    tools: Sequence[Tool | ShellTool]
    data: dict[str, Any] = field(default_factory=dict)


# A reward function of the task and its finished episode, in [0, 1] by convention.
Reward = Callable[[ToolTask, Episode], float]


def compose(rewards: Sequence[tuple[Reward, float]], task: ToolTask, episode: Episode) -> float:
    """The weighted sum of the rewards (weights need not sum to 1)."""
    return sum(weight * float(reward(task, episode)) for reward, weight in rewards)


class ToolEnvConfig(BaseEnvConfig):  # type: ignore[misc]  # atroposlib has no type information
    max_turns: int = Field(3, ge=1, le=64, description="Most replies of the policy in one episode.")
    max_reply_tokens: int = Field(96, ge=1, description="Most tokens of one reply.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    eval_items: int = Field(8, ge=0, description="Held-out tasks per evaluation, greedy (0: no evaluation).")
    seed: int = Field(0, description="Seed of the task stream.")


class ToolEnv(BaseEnv):  # type: ignore[misc]
    """Base of multi-turn tool environments: subclass it, write `next_task` and `rewards`."""

    env_config_cls = ToolEnvConfig
    rewards: Sequence[tuple[Reward, float]] = ()

    def __init__(self, config: ToolEnvConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: ToolEnvConfig = config
        self.tasks = random.Random(config.seed)
        self.recent: list[tuple[float, Episode]] = []
        self.eval_metrics: list[tuple[str, float]] = []
        self._template: Template | None = None

    # --- what an author writes -------------------------------------------------------------------

    def next_task(self, rng: random.Random) -> ToolTask:
        """A new task drawn from `rng` (training draws from the env's stream, evaluation from a held-out one)."""
        raise NotImplementedError

    # --- the rest ---------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Tasks are drawn on the fly; nothing to load."""

    async def get_next_item(self) -> ToolTask:
        return self.next_task(self.tasks)

    @property
    def template(self) -> Template:
        if self._template is None:
            self._template = Template(self.tokenizer)
        return self._template

    def score(self, task: ToolTask, episode: Episode) -> float:
        return compose(self.rewards, task, episode)

    def held_out_tasks(self, count: int) -> list[ToolTask]:
        """The first `count` held-out tasks (their own seeded stream, never the training one): what `evaluate` and
        the control plane's evaluations (docs/EVALUATIONS.md#tool-environments) play."""
        held_out = random.Random(self.config.seed + 1_000_003)
        return [self.next_task(held_out) for _ in range(count)]

    async def episode(
        self, task: ToolTask, temperature: float, split: str = "train", sample: Sampler | None = None
    ) -> Episode:
        """One conversation on `task`, sampled from the run's model server (or `sample`: an evaluation's model);
        sandboxed tools get a fresh work directory, removed afterwards."""
        if sample is None:
            sample = server_sampler(self.server, self.server.servers[0].config.model_name, temperature, split)
        with tempfile.TemporaryDirectory(prefix="rlctl-tool-episode-") as scratch:
            tools = {
                tool.name: tool.bind(Path(scratch)) if isinstance(tool, ShellTool) else tool for tool in task.tools
            }

            async def run_tool(call: ParsedToolCall) -> str:
                tool = tools.get(call.name)
                if tool is None:
                    raise ToolCallFailed(f"no tool named {call.name!r}; tools: {', '.join(sorted(tools))}")
                return await tool(call.arguments)

            return await run_episode(
                self.template,
                task.messages,
                [tool.schema() for tool in task.tools],
                sample,
                run_tool,
                max_turns=self.config.max_turns,
                max_reply_tokens=self.config.max_reply_tokens,
                max_tokens=self.config.max_token_length,
            )

    async def collect_trajectories(self, item: ToolTask) -> tuple[ScoredDataGroup | None, list[Any]]:
        episodes = await run_group([self.episode(item, self.config.temperature) for _ in range(self.config.group_size)])
        scores = [self.score(item, episode) for episode in episodes]
        self.recent.extend(zip(scores, episodes, strict=True))
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        for episode, score in zip(episodes, scores, strict=True):
            group["tokens"].append(episode.tokens)
            group["masks"].append(episode.masks)
            group["scores"].append(score)
            group["inference_logprobs"].append(episode.logprobs)
            group["messages"].append(episode.messages)
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy episodes on held-out tasks (their own seeded stream): eval/percent_correct is the mean score,
        eval/agent/... the turn statistics."""
        if self.config.eval_items == 0:
            return
        tasks = self.held_out_tasks(self.config.eval_items)
        episodes = await run_group([self.episode(task, 0.0, split="eval") for task in tasks])
        scores = [self.score(task, episode) for task, episode in zip(tasks, episodes, strict=True)]
        self.eval_metrics.append(("eval/percent_correct", sum(scores) / len(scores)))
        self.eval_metrics.extend((f"eval/{key}", value) for key, value in episode_metrics(episodes).items())

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        wandb_metrics = dict(wandb_metrics or {})
        if self.recent:
            scores = [score for score, _ in self.recent]
            wandb_metrics["train/percent_correct"] = sum(scores) / len(scores)
            wandb_metrics.update(episode_metrics([episode for _, episode in self.recent]))
            self.recent = []
        wandb_metrics.update(self.eval_metrics)
        self.eval_metrics = []
        await super().wandb_log(wandb_metrics)
