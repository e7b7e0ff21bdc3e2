"""Dataset (offline): train on a trajectory dataset's stored completions, grouped by prompt.

rlctl starts it for a run created with a dataset in `offline` mode (docs/RUNS.md#training-on-a-dataset); it reads
the run's training groups (`groups_path`: GRPO export lines written when the run was created) and sends each
group to the Atropos API as a scored group: the conversations rendered with the run's tokenizer and chat
template, every assistant turn trained and every other token masked, and the stored rewards as scores (the
trainer turns them into the group's GRPO advantages, as the GRPO export does).
Nothing is sampled: the policy only learns from the stored completions. In an `sft` run (`sft_top_n` set) the
scores are 1 for the best `sft_top_n` completions of each group and 0 for the rest, which the trainer's
cross-entropy loss turns into supervised training on those alone.
"""

from __future__ import annotations

import json
import random
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from rlctl.environment_kit.servers import local_model_server, tiny_model_dir
from rlctl.trajectories.records import record_from_dict
from rlctl.trajectories.training import chat_messages, training_tokens


class DatasetOfflineConfig(BaseEnvConfig):
    groups_path: str | None = Field(None, description="The run's training groups; set by rlctl.")
    epochs: int = Field(1, ge=1, le=1000, description="Passes over the training groups.")
    shuffle: bool = Field(True, description="Shuffle the groups in each epoch (seeded).")
    seed: int = Field(0, description="Seed of the shuffle and of the records drawn from larger groups.")
    normalize_by_std: bool = Field(False, description="Divide each group's advantages by its reward std (trainer).")
    sft_top_n: int | None = Field(
        None, ge=1, description="An sft run's: score its N best-rewarded completions of each group 1, the rest 0."
    )


def top_n_scores(rewards: list[float], top_n: int) -> list[float]:
    """1.0 for the `top_n` highest rewards of a group (the earlier record first among equals), 0.0 for the rest:
    with the trainer's cross-entropy loss and no advantage normalisation, only those completions are trained."""
    ranked = sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))[:top_n]
    return [1.0 if i in ranked else 0.0 for i in range(len(rewards))]


def group_offsets(path: str) -> list[int]:
    """Byte offset of each line: one group is read at a time, never the whole file."""
    offsets, position = [], 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                offsets.append(position)
            position += len(line)
    return offsets


def epoch_order(count: int, epoch: int, shuffle: bool, seed: int) -> list[int]:
    order = list(range(count))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def draw(size: int, group_size: int, seed: int, epoch: int, key: str) -> list[int]:
    """Which records of a group train this epoch: all of them when the group has exactly `group_size`, else a
    seeded sample of `group_size` (a group is never split, and Atropos packs batches of whole groups)."""
    if size == group_size:
        return list(range(size))
    return sorted(random.Random(f"{seed}:{epoch}:{key}").sample(range(size), group_size))


class DatasetOfflineEnv(BaseEnv):
    """Train on a trajectory dataset's stored completions, grouped by prompt, with GRPO advantages."""

    name = "dataset_offline"
    env_config_cls = DatasetOfflineConfig

    def __init__(self, config: DatasetOfflineConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: DatasetOfflineConfig = config
        self.offsets: list[int] = []
        self.position = 0  # groups handed out so far, over all epochs

    @classmethod
    def config_init(cls) -> tuple[DatasetOfflineConfig, list[APIServerConfig]]:
        tokenizer = tiny_model_dir()
        config = DatasetOfflineConfig(
            tokenizer_name=tokenizer,
            group_size=4,
            batch_size=16,
            total_steps=60,
            steps_per_eval=1000,
            max_token_length=512,
            use_wandb=False,
            wandb_name="dataset_offline",
            ensure_scores_are_not_same=False,  # groups of equal rewards are the trainer's to skip and count
        )
        return config, [local_model_server(tokenizer)]

    async def setup(self) -> None:
        if not self.config.groups_path:
            raise ValueError("groups_path is not set: this environment runs only as a dataset run of rlctl")
        self.offsets = group_offsets(self.config.groups_path)
        if not self.offsets:
            raise ValueError(f"{self.config.groups_path} holds no training group")

    async def get_next_item(self) -> dict[str, int]:
        """The next group in epoch order; after the last epoch the order starts again (the trainer's step count
        ends the run, so groups sent ahead of it are never trained)."""
        count = len(self.offsets)
        epoch, index = divmod(self.position, count)
        self.position += 1
        return {"epoch": epoch, "group": epoch_order(count, epoch, self.config.shuffle, self.config.seed)[index]}

    def read_group(self, index: int) -> dict[str, Any]:
        with open(str(self.config.groups_path), "rb") as handle:
            handle.seek(self.offsets[index])
            return json.loads(handle.readline())

    async def collect_trajectories(self, item: dict[str, int]) -> tuple[ScoredDataGroup | None, list]:
        group = self.read_group(item["group"])
        chosen = draw(
            len(group["trajectories"]), self.config.group_size, self.config.seed, item["epoch"], group["group_key"]
        )
        # The rewards are the scores: the trainer turns them into the group's GRPO advantages (normalised when the
        # run asks, `tinker.normalize_advantages`), as it does for every environment.
        rewards = [float(group["rewards"][i]) for i in chosen]
        if self.config.sft_top_n is not None:  # a supervised run (docs/RUNS.md#supervised-warm-up)
            rewards = top_n_scores(rewards, self.config.sft_top_n)
        scored = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for i, reward in zip(chosen, rewards, strict=True):
            trajectory = {k: v for k, v in group["trajectories"][i].items() if k != "advantage"}
            messages = chat_messages(record_from_dict(trajectory))
            tokens, masks = training_tokens(self.tokenizer, messages)
            scored["tokens"].append(tokens)
            scored["masks"].append(masks)
            scored["scores"].append(reward)
            scored["messages"].append(messages)
        return scored, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to evaluate while training: held-out prompts are evaluated through rlctl's evaluations."""


if __name__ == "__main__":
    DatasetOfflineEnv.cli()
