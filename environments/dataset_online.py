"""Dataset (online): a trajectory dataset's prompts, answered by the policy and scored by named rewards.

rlctl starts it for a run created with a dataset in `online` mode (docs/RUNS.md#training-on-a-dataset). Its prompts
(`prompts_path`) are the turns before each prompt's first assistant turn, written when the run was created; each
one is sampled `group_size` times from the run's inference server, and each completion is scored by the run's
rewards (`rewards`: built-in reward functions, or environments that offer a scorer) against the prompt's
expected answer (`answer_field` of its metadata). The held-out prompts (`held_out_path`) are the evaluation set.

The `judge` and `completion` rewards score a prompt's whole group at once: the group of the policy's completions
goes to the judge model (`dataset_judge`: its URL, model and rubric; its key comes in this process's environment,
never in the config file), and a group the judge cannot score is left out of training and counted, never 0.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from rlctl.environment_kit.sampling import sample_group, scored_group
from rlctl.environment_kit.servers import local_model_server, tiny_model_dir
from rlctl.judging.client import CachedJudge, judge_in_this_process
from rlctl.judging.groups import judge_fresh_group, weighted_scores
from rlctl.trajectories.judge import DEFAULT_RUBRIC, GROUP_REWARDS
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.rewards import WeightedReward, build_rewards, score_record
from rlctl.trajectories.training import record_with_completion


class DatasetOnlineConfig(BaseEnvConfig):
    prompts_path: str | None = Field(None, description="The run's training prompts; set by rlctl.")
    held_out_path: str | None = Field(None, description="The run's held-out prompts; set by rlctl.")
    rewards: list[dict[str, Any]] = Field(default_factory=list, description="The run's rewards; set by rlctl.")
    answer_field: str = Field("answer", description="Metadata field of the expected answer; set by rlctl.")
    dataset_judge: dict[str, Any] | None = Field(
        None, description="The judge of the judge and completion rewards (base_url, model, rubric); set by rlctl."
    )
    max_tokens: int = Field(16, ge=1, le=32768, description="Most tokens of a completion.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    seed: int = Field(0, description="Seed of the prompt order and of the held-out split.")
    eval_items: int = Field(8, ge=0, description="Held-out prompts per evaluation, answered greedily (0: none).")


class EnvironmentFileScorer:
    """An environment's `score_completion(completion, gold)`, imported from its file (this process runs
    environment code anyway); `gold_answer`/`normalize_number` turn the expected answer first when defined."""

    def __init__(self, name: str, file: str, answer_field: str) -> None:
        spec = importlib.util.spec_from_file_location(f"rlctl_scorer_{name}", file)
        if spec is None or spec.loader is None:
            raise ValueError(f"no environment file for reward {name!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.module, self.answer_field = module, answer_field

    def score(self, record: TrajectoryRecord) -> float:
        expected = record.metadata.get(self.answer_field)
        if expected is None:
            return 0.0
        gold = str(expected)
        for name in ("gold_answer", "normalize_number"):
            convert = getattr(self.module, name, None)
            if convert is not None and (value := convert(gold)) is not None:
                gold = value
                break
        completion = next((t.value for t in reversed(record.turns) if t.role == "gpt"), "")
        return float(self.module.score_completion(completion, gold))


def load_rewards(spec: list[dict[str, Any]], answer_field: str) -> list[WeightedReward]:
    """The rewards that score one record alone (the group rewards are the judge's)."""
    plain = [e for e in spec if e["name"] not in GROUP_REWARDS]
    built_in = {"correctness", "format", "source_reward"}
    scorers = {
        e["name"]: EnvironmentFileScorer(e["name"], e["file"], answer_field) for e in plain if e["name"] not in built_in
    }
    entries = [{**e, "params": {"answer_key": answer_field}} if e["name"] == "correctness" else e for e in plain]
    return build_rewards(entries, scorers)


def read_prompts(path: str | None) -> list[dict[str, Any]]:
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


class DatasetOnlineEnv(BaseEnv):
    """A trajectory dataset's prompts, answered by the policy, scored by named rewards."""

    name = "dataset_online"
    env_config_cls = DatasetOnlineConfig

    def __init__(self, config: DatasetOnlineConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: DatasetOnlineConfig = config
        self.prompts: list[dict[str, Any]] = []
        self.held_out: list[dict[str, Any]] = []
        self.rewards: list[WeightedReward] = []
        self.judge: CachedJudge | None = None
        self.position = 0
        self.recent_scores: list[float] = []
        self.unscored_groups = 0  # groups left out of training because the judge could not score them
        self.unscored_eval_items = 0
        self.eval_metrics: list[tuple[str, float]] = []

    @classmethod
    def config_init(cls) -> tuple[DatasetOnlineConfig, list[APIServerConfig]]:
        tokenizer = tiny_model_dir()
        config = DatasetOnlineConfig(
            tokenizer_name=tokenizer,
            group_size=8,
            batch_size=32,
            total_steps=60,
            steps_per_eval=20,
            max_token_length=512,
            use_wandb=False,
            wandb_name="dataset_online",
            ensure_scores_are_not_same=False,  # groups of equal rewards are the trainer's to skip and count
        )
        return config, [local_model_server(tokenizer)]

    async def setup(self) -> None:
        self.prompts = read_prompts(self.config.prompts_path)
        self.held_out = read_prompts(self.config.held_out_path)
        if not self.prompts:
            raise ValueError("prompts_path holds no prompt: this environment runs only as a dataset run of rlctl")
        if not self.config.rewards:
            raise ValueError("no reward: an online dataset run names its rewards")
        if self.group_reward_names and not self.config.dataset_judge:
            raise ValueError("the judge and completion rewards need `dataset_judge`: rlctl sets it when it has a judge")
        if self.config.dataset_judge:
            self.judge = judge_in_this_process(self.config.dataset_judge)  # before the scorers' code is imported
        self.rewards = load_rewards(self.config.rewards, self.config.answer_field)

    @property
    def group_reward_names(self) -> list[str]:
        return [e["name"] for e in self.config.rewards if e["name"] in GROUP_REWARDS]

    async def get_next_item(self) -> dict[str, Any]:
        epoch, index = divmod(self.position, len(self.prompts))
        self.position += 1
        order = list(range(len(self.prompts)))
        random.Random(f"{self.config.seed}:{epoch}").shuffle(order)
        return self.prompts[order[index]]

    async def score_group(self, prompt: dict[str, Any], completions: Sequence[str]) -> list[float] | None:
        """The rewards of a prompt's completions, in order (the request's weighted sum); None when a group reward
        could not be decided (the judge failed): the group is then unscored, never 0."""
        records = [record_with_completion(prompt["messages"], text, prompt.get("metadata")) for text in completions]
        names = self.group_reward_names
        if not names:
            return [score_record(record, self.rewards).reward for record in records]
        assert self.judge is not None
        rubric = (self.config.dataset_judge or {}).get("rubric") or DEFAULT_RUBRIC
        outcomes = await asyncio.to_thread(judge_fresh_group, self.judge, records, names, rubric)
        plain = {weighted.function.name: weighted for weighted in self.rewards}
        return weighted_scores(records, self.config.rewards, plain, outcomes)

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredDataGroup | None, list]:
        messages = item["messages"]
        samples = await sample_group(
            self,
            messages,
            n=self.config.group_size,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        scores = await self.score_group(item, [text for text, *_ in samples])
        if scores is None:
            self.unscored_groups += 1
            return None, []
        self.recent_scores.extend(scores)
        return scored_group(messages, samples, scores), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy answers to the held-out prompts; eval/reward_mean is their mean reward (the judge scores each
        answer alone, a group of one)."""
        items = self.held_out[: self.config.eval_items]
        if not items:
            return
        scores = []
        for prompt in items:
            completion = await self.server.chat_completion(
                messages=prompt["messages"], n=1, max_tokens=self.config.max_tokens, temperature=0.0, split="eval"
            )
            scored = await self.score_group(prompt, [completion.choices[0].message.content or ""])
            if scored is None:  # a judged answer the judge could not score: left out of the mean, counted
                self.unscored_eval_items += 1
            else:
                scores.extend(scored)
        if scores:
            self.eval_metrics.append(("eval/reward_mean", sum(scores) / len(scores)))

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        wandb_metrics = dict(wandb_metrics or {})
        if self.recent_scores:
            wandb_metrics["train/reward_mean"] = sum(self.recent_scores) / len(self.recent_scores)
            self.recent_scores = []
        wandb_metrics.update(self.eval_metrics)
        self.eval_metrics = []
        if self.judge is not None:  # running totals of the run
            wandb_metrics.update(self.judge.counters.run_metrics())
            wandb_metrics["train/unscored_groups"] = self.unscored_groups
            wandb_metrics["eval/unscored_items"] = self.unscored_eval_items
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    DatasetOnlineEnv.cli()
