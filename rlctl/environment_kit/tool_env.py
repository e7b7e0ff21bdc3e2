"""The base of multi-turn tool environments (docs/TOOL_ENVIRONMENTS.md).

An author subclasses `ToolEnv` and writes three things: `next_task()` (a `ToolTask`: the opening messages and the
tools of one task), and `rewards` (weighted reward functions of the task and the finished episode, composed into
the score). Everything else is here: a group of `group_size` episodes per task (GRPO compares episodes of the same
task), each a conversation of up to `max_turns` replies (`agents.py`), the Atropos group with only the policy's
tokens trained, and the per-turn statistics logged as run metrics (`agent/...`).

Tools are pure-Python callables (`Tool`), or the collections' sandboxed tools with their limits (`SandboxTools`:
`terminal`, `read_file`, `write_file`, one kept sandbox per episode).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import random
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
from rlctl.judging.client import CachedJudge, judge_in_this_process
from rlctl.judging.groups import judged_scores
from rlctl.sandbox.bubblewrap import Sandbox, find_sandbox, require_sandbox
from rlctl.sandbox.toolbox import SCHEMAS, TOOL_NAMES, Toolbox
from rlctl.trajectories.tool_calls import ParsedToolCall
from rlctl.trajectories.training import record_of_conversation


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


# A tool of one episode: its arguments to its result's text (ToolCallFailed for a failed call).
BoundTool = Callable[[Any], Awaitable[str]]


@dataclass(frozen=True)
class SandboxTools:
    """The collections' sandboxed tools (rlctl/sandbox/toolbox.py), by `names`: `terminal(command)` (bash in the
    bubblewrap sandbox, no network), `read_file(path)`, `write_file(path, content)`, with the collections' checks
    and limits, in one kept sandbox per episode (its work directory a tmpfs of its own where one can be made), made
    at the episode's first call of one of them and ended with the episode. Results are the toolbox's JSON text; one
    with an `error` (a time-out, a refused path, ...) is a failed call, as a collection counts it."""

    names: tuple[str, ...] = TOOL_NAMES
    timeout_s: float = 10.0
    output_limit: int = 2000
    bwrap: str = "bwrap"
    sandbox_uid: int = 65534

    def __post_init__(self) -> None:
        unknown = set(self.names) - set(TOOL_NAMES)
        if unknown or not self.names:
            raise ValueError(f"sandbox tools are some of {', '.join(TOOL_NAMES)}; not {sorted(unknown) or 'none'}")

    def schemas(self) -> list[dict[str, Any]]:
        return [SCHEMAS[name] for name in TOOL_NAMES if name in self.names]

    def open(self, workdir: Path) -> Toolbox:
        """The toolbox of one episode, in `workdir` (an empty directory); close it when the episode ends. `terminal`
        needs the sandbox (SandboxUnavailable without); the file tools, confined by the work directory's own checks,
        run without one where none can be made, as a collection's do."""
        if "terminal" in self.names:
            sandbox: Sandbox | None = require_sandbox(self.bwrap, self.sandbox_uid)
        else:
            found = find_sandbox(self.bwrap, self.sandbox_uid)
            sandbox = None if isinstance(found, str) else found
        if sandbox is not None:
            sandbox.prepare(workdir)
        return Toolbox(list(self.names), workdir, self.timeout_s, self.output_limit, sandbox=sandbox)


class EpisodeToolbox:
    """The toolbox of `tools` for one episode, opened at its first call (an episode that calls none of them starts
    no sandbox) with the task's `files` written into its work directory, and closed with the episode."""

    def __init__(self, tools: SandboxTools, workdir: Path, files: Mapping[str, str] | None = None) -> None:
        self.tools = tools
        self.workdir = workdir
        self.files = dict(files or {})
        self._toolbox: Toolbox | None = None
        self._opening = asyncio.Lock()

    async def toolbox(self) -> Toolbox:
        async with self._opening:
            if self._toolbox is None:
                self.workdir.mkdir()
                self._toolbox = await asyncio.to_thread(self._opened)
            return self._toolbox

    def _opened(self) -> Toolbox:
        toolbox = self.tools.open(self.workdir)
        try:
            for path, content in self.files.items():  # through the work directory's own checks and limits
                toolbox.workdir.write(path, content.encode("utf-8"))
        except BaseException:
            toolbox.close()
            raise
        return toolbox

    async def close(self) -> None:
        if self._toolbox is not None:
            await asyncio.to_thread(self._toolbox.close)

    def bound(self) -> dict[str, BoundTool]:
        return {name: self._call_of(name) for name in self.tools.names}

    def _call_of(self, name: str) -> BoundTool:
        async def call(arguments: Any) -> str:  # off the event loop: a sandboxed call blocks
            result = await asyncio.to_thread((await self.toolbox()).call, name, arguments)
            error = json.loads(result).get("error")
            if error:
                raise ToolCallFailed(str(error), result=result)
            return result

        return call


@dataclass
class ToolTask:
    """One task: the conversation's opening `messages`, its `tools`, whatever the rewards check (`data`), and the
    `files` (path: text) its sandboxed tools find in their work directory."""

    messages: list[dict[str, Any]]
    tools: Sequence[Tool | SandboxTools]
    data: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


def task_schemas(task: ToolTask) -> list[dict[str, Any]]:
    """The task's tools in OpenAI's format, as the chat template renders them."""
    return [
        schema
        for tool in task.tools
        for schema in (tool.schemas() if isinstance(tool, SandboxTools) else [tool.schema()])
    ]


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
    judge_rubric: str | None = Field(
        None,
        max_length=4000,
        description="With a rubric, the service's judge scores each task's group of episodes against it, and its "
        "score, times judge_weight, is added to the environment's own rewards (docs/TOOL_ENVIRONMENTS.md#judge).",
    )
    judge_weight: float = Field(1.0, ge=0.0, le=100.0, description="Weight of the judge's score (with judge_rubric).")
    judge: dict[str, Any] | None = Field(
        None, description="The service's judge (base_url, model; never its key), for judge_rubric; set by rlctl."
    )


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
        self._judge: CachedJudge | None = None
        self.unscored_groups = 0  # groups left out of training because the judge could not score them
        self.unscored_eval_items = 0

    # --- what an author writes -------------------------------------------------------------------

    def next_task(self, rng: random.Random) -> ToolTask:
        """A new task drawn from `rng` (training draws from the env's stream, evaluation from a held-out one)."""
        raise NotImplementedError

    # --- the rest ---------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Tasks are drawn on the fly; with a `judge_rubric`, the judge's client is made now (a subclass's `setup`
        calls this one)."""
        if self.config.judge_rubric:  # a run without the service's judge fails at its start
            self._judge = self._judge or self._service_judge()

    async def get_next_item(self) -> ToolTask:
        return self.next_task(self.tasks)

    @property
    def template(self) -> Template:
        if self._template is None:
            self._template = Template(self.tokenizer)
        return self._template

    @property
    def judge(self) -> CachedJudge:
        """The service's judge, for `judge_rubric` (rlctl writes `judge` in the run's config and hands the key to
        this process in its environment)."""
        if self._judge is None:
            self._judge = self._service_judge()
        return self._judge

    def _service_judge(self) -> CachedJudge:
        if not self.config.judge:
            raise ValueError("judge_rubric needs the service's judge: rlctl sets `judge` when it has one")
        return judge_in_this_process(self.config.judge)

    def score(self, task: ToolTask, episode: Episode) -> float:
        """The environment's own rewards of one episode (the judge's score, with `judge_rubric`, is added by
        `score_group`)."""
        return compose(self.rewards, task, episode)

    async def score_group(self, task: ToolTask, episodes: Sequence[Episode]) -> list[float] | None:
        """The scores of a task's episodes, in order: their own rewards, plus the judge's score of the group against
        `judge_rubric` times `judge_weight` when there is a rubric. None when the judge could not score the group:
        it is left out, never 0."""
        own = [self.score(task, episode) for episode in episodes]
        rubric = self.config.judge_rubric
        if not rubric:
            return own
        records = [record_of_conversation(episode.messages) for episode in episodes]
        return await asyncio.to_thread(judged_scores, self.judge, records, rubric, own, self.config.judge_weight)

    def held_out_tasks(self, count: int) -> list[ToolTask]:
        """The first `count` held-out tasks (their own seeded stream, never the training one): what `evaluate` and
        the control plane's evaluations (docs/EVALUATIONS.md#tool-environments) play."""
        held_out = random.Random(self.config.seed + 1_000_003)
        return [self.next_task(held_out) for _ in range(count)]

    def sampler(self, temperature: float, split: str = "train") -> Sampler:
        """The run's model server as a sampler; a group's episodes share one, so their common first turn goes out as
        one request of `group_size` rows (`agents.coalesced`)."""
        return server_sampler(self.server, self.server.servers[0].config.model_name, temperature, split)

    async def episode(
        self, task: ToolTask, temperature: float, split: str = "train", sample: Sampler | None = None
    ) -> Episode:
        """One conversation on `task`, sampled from the run's model server (or `sample`: an evaluation's model);
        sandboxed tools get a kept sandbox of their own, ended with the episode."""
        if sample is None:
            sample = self.sampler(temperature, split)
        async with contextlib.AsyncExitStack() as stack:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlctl-tool-episode-")))
            tools: dict[str, BoundTool] = {}
            for index, tool in enumerate(task.tools):
                if isinstance(tool, SandboxTools):
                    toolbox = EpisodeToolbox(tool, scratch / f"sandbox-{index}", task.files)
                    stack.push_async_callback(toolbox.close)
                    tools.update(toolbox.bound())
                else:
                    tools[tool.name] = tool

            async def run_tool(call: ParsedToolCall) -> str:
                tool = tools.get(call.name)
                if tool is None:
                    raise ToolCallFailed(f"no tool named {call.name!r}; tools: {', '.join(sorted(tools))}")
                return await tool(call.arguments)

            return await run_episode(
                self.template,
                task.messages,
                task_schemas(task),
                sample,
                run_tool,
                max_turns=self.config.max_turns,
                max_reply_tokens=self.config.max_reply_tokens,
                max_tokens=self.config.max_token_length,
            )

    async def collect_trajectories(self, item: ToolTask) -> tuple[ScoredDataGroup | None, list[Any]]:
        sample = self.sampler(self.config.temperature)
        episodes = await run_group(
            [self.episode(item, self.config.temperature, sample=sample) for _ in range(self.config.group_size)]
        )
        scores = await self.score_group(item, episodes)
        if scores is None:
            self.unscored_groups += 1
            return None, []
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
        """Greedy episodes on held-out tasks (their own seeded stream): eval/percent_correct is the mean score (the
        judge scores each episode alone; one it cannot score is left out and counted), eval/agent/... the turn
        statistics."""
        if self.config.eval_items == 0:
            return
        tasks = self.held_out_tasks(self.config.eval_items)
        sample = self.sampler(0.0, "eval")
        episodes = await run_group([self.episode(task, 0.0, split="eval", sample=sample) for task in tasks])
        judged = await asyncio.gather(
            *(self.score_group(task, [episode]) for task, episode in zip(tasks, episodes, strict=True))
        )
        scores = [score for scored in judged if scored is not None for score in scored]
        self.unscored_eval_items += sum(scored is None for scored in judged)
        if scores:
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
        if self._judge is not None:  # running totals of the run
            wandb_metrics.update(self._judge.counters.run_metrics())
            wandb_metrics["train/unscored_groups"] = self.unscored_groups
            wandb_metrics["eval/unscored_items"] = self.unscored_eval_items
        await super().wandb_log(wandb_metrics)
