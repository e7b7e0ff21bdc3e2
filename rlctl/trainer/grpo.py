"""GRPO batch preparation and step metrics: pure functions over Atropos groups, no I/O.

An Atropos group carries, per rollout, `tokens` (prompt + completion), `masks` (-100 on prompt positions,
the token id on completion positions), a scalar score, and optionally `inference_logprobs` aligned with
`tokens` (1.0 on prompt positions). One datum per rollout predicts tokens[1:] from tokens[:-1].

Atropos's other group fields (docs/TRAINER.md#atropos-group-fields): per-token `advantages` take precedence over
`scores`; `overrides[i]["set_advantage_to_zero"]` keeps rollout i out of training; every other field the trainer
cannot honour (reference logprobs, distillation targets, images, unknown override keys) refuses the batch
(`UnsupportedBatch`), never silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.trainer.defaults import PPO_CLIP_HIGH, PPO_CLIP_LOW
from rlctl.trainer.failures import UNSUPPORTED_BATCH, TrainingHalted
from rlctl.trajectories.grpo import group_advantages

PROMPT_MASK = -100


@dataclass(frozen=True)
class TrainingDatum:
    input_tokens: list[int]
    target_tokens: list[int]
    advantages: list[float]  # zero on prompt positions
    completion_mask: list[bool]  # which targets are completion tokens (for metrics)
    sampler_logprobs: list[float] | None  # None: the backend computes them with a forward pass

    def with_sampler_logprobs(self, logprobs: Sequence[float]) -> TrainingDatum:
        return TrainingDatum(
            self.input_tokens, self.target_tokens, self.advantages, self.completion_mask, list(logprobs)
        )


@dataclass
class PreparedBatch:
    data: list[TrainingDatum] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # every rollout in the batch
    completion_lengths: list[int] = field(default_factory=list)  # completion tokens of every rollout
    trained_advantages: list[float] = field(default_factory=list)  # one per datum
    num_groups: int = 0
    skipped_groups: int = 0

    @property
    def num_sequences(self) -> int:
        return len(self.rewards)


@dataclass(frozen=True)
class PolicyLoss:
    """The per-token loss of a step (docs/TRAINER.md#grpo-step), by Tinker's names: `importance_sampling` weighs
    the advantage by the ratio of current to sampler probability; `ppo` clips that ratio to [clip_low, clip_high]
    and takes the smaller objective, so a token the policy already moved far from its sampler pushes no further."""

    name: str = "importance_sampling"
    clip_low: float = PPO_CLIP_LOW
    clip_high: float = PPO_CLIP_HIGH

    def token_loss(self, logprob: float, sampler_logprob: float, advantage: float) -> float:
        ratio = math.exp(logprob - sampler_logprob)
        if self.name == "ppo":
            clipped = min(max(ratio, self.clip_low), self.clip_high)
            return -min(ratio * advantage, clipped * advantage)
        return -ratio * advantage

    def tinker_config(self) -> dict[str, float] | None:
        """Tinker's `loss_fn_config` for this loss."""
        if self.name != "ppo":
            return None
        return {"clip_low_threshold": self.clip_low, "clip_high_threshold": self.clip_high}

    def summed(self, data: Sequence[TrainingDatum], logprobs: Sequence[Sequence[float]]) -> float:
        """The loss summed over every target token of every datum."""
        return sum(
            self.token_loss(current, sampled, advantage)
            for datum, row in zip(data, logprobs, strict=True)
            for current, sampled, advantage in zip(row, datum.sampler_logprobs or [], datum.advantages, strict=True)
        )


class UnsupportedBatch(TrainingHalted):
    """A group carries a field the trainer cannot honour: the run fails `unsupported_batch` at once."""

    def __init__(self, message: str) -> None:
        super().__init__(UNSUPPORTED_BATCH, message)


# Group fields that would change what is trained and that this trainer does not implement.
UNSUPPORTED_FIELDS = {
    "ref_logprobs": "reference logprobs (a KL penalty to a reference model)",
    "distill_token_ids": "on-policy distillation targets",
    "distill_logprobs": "on-policy distillation targets",
    "images": "images (multimodal rollouts)",
}
SET_ADVANTAGE_TO_ZERO = "set_advantage_to_zero"
HONOURED_OVERRIDES = {SET_ADVANTAGE_TO_ZERO}
# group_size is the API's batching concern (it counts rollouts per group), not the trainer's.
HONOURED_GROUP_OVERRIDES = {"group_size"}


def _present(value: Any) -> bool:
    """Atropos's base environment sends absent fields as None or as empty lists/dicts."""
    if value is None:
        return False
    if isinstance(value, list | dict):
        return any(item not in (None, [], {}) for item in (value.values() if isinstance(value, dict) else value))
    return True


def check_group(group: dict[str, Any]) -> None:
    """Refuse a group carrying a field the trainer cannot honour (UnsupportedBatch)."""
    for name, what in UNSUPPORTED_FIELDS.items():
        if _present(group.get(name)):
            raise UnsupportedBatch(f"a group carries `{name}` ({what}), which this trainer does not implement")
    unknown = {key for item in group.get("overrides") or [] for key in (item or {})} - HONOURED_OVERRIDES
    unknown |= set(group.get("group_overrides") or {}) - HONOURED_GROUP_OVERRIDES
    if unknown:
        raise UnsupportedBatch(
            f"a group carries overrides this trainer cannot honour: {sorted(unknown)} "
            f"(honoured: {sorted(HONOURED_OVERRIDES | HONOURED_GROUP_OVERRIDES)})"
        )
    advantages: list[list[float]] = group.get("advantages") or []
    if _present(advantages):
        if len(advantages) != len(group["tokens"]):
            raise UnsupportedBatch(f"a group has {len(advantages)} advantage rows for {len(group['tokens'])} rollouts")
        for row, tokens in zip(advantages, group["tokens"], strict=True):
            if len(row) != len(tokens):
                raise UnsupportedBatch(f"an advantages row has {len(row)} entries for {len(tokens)} tokens")


def rollout_advantages(group: dict[str, Any], normalize_by_std: bool) -> list[float | list[float]]:
    """Each rollout's advantage: the environment's per-token row when it sent `advantages` (its tokens' order),
    else the GRPO advantage of its score; zero for a rollout whose override says `set_advantage_to_zero`."""
    advantages: list[float | list[float]]
    if _present(group.get("advantages")):
        advantages = [[float(value) for value in row] for row in group["advantages"]]
    else:
        advantages = list(group_advantages([float(score) for score in group["scores"]], normalize_by_std))
    overrides = group.get("overrides") or []
    for index, item in enumerate(overrides[: len(advantages)]):
        if (item or {}).get(SET_ADVANTAGE_TO_ZERO):
            advantages[index] = 0.0
    return advantages


def _is_zero(advantage: float | Sequence[float]) -> bool:
    values = [advantage] if isinstance(advantage, int | float) else advantage
    return all(abs(value) < 1e-12 for value in values)


def build_datum(
    tokens: Sequence[int],
    masks: Sequence[int],
    advantage: float | Sequence[float],
    inference_logprobs: Sequence[float] | None,
    max_length: int,
) -> TrainingDatum | None:
    """One datum for one rollout, truncated to `max_length` tokens; None when nothing is left to predict.
    `advantage` is the rollout's, or one per token of `tokens` (the target tokens[i] takes advantage[i])."""
    if len(masks) != len(tokens):
        raise ValueError(f"masks has {len(masks)} entries for {len(tokens)} tokens")
    tokens, masks = list(tokens[:max_length]), list(masks[:max_length])
    if len(tokens) < 2:
        return None
    completion_mask = [mask != PROMPT_MASK for mask in masks[1:]]
    if not any(completion_mask):
        return None
    sampler_logprobs = None
    if inference_logprobs is not None and len(inference_logprobs) >= len(tokens):
        sampler_logprobs = [float(value) for value in inference_logprobs[1 : len(tokens)]]
    per_target = (
        [advantage] * len(completion_mask) if isinstance(advantage, int | float) else advantage[1 : len(tokens)]
    )
    return TrainingDatum(
        input_tokens=tokens[:-1],
        target_tokens=tokens[1:],
        advantages=[
            float(value) if trained else 0.0 for value, trained in zip(per_target, completion_mask, strict=True)
        ],
        completion_mask=completion_mask,
        sampler_logprobs=sampler_logprobs,
    )


def prepare_batch(groups: Sequence[dict[str, Any]], max_length: int, normalize_by_std: bool = False) -> PreparedBatch:
    """Datums for every rollout of every group whose advantages are not all zero. Every group is checked first,
    so a batch with a field the trainer cannot honour trains nothing (UnsupportedBatch)."""
    for group in groups:
        check_group(group)
    batch = PreparedBatch(num_groups=len(groups))
    for group in groups:
        scores = [float(score) for score in group["scores"]]
        batch.rewards.extend(scores)
        batch.completion_lengths.extend(sum(1 for mask in masks if mask != PROMPT_MASK) for masks in group["masks"])
        advantages = rollout_advantages(group, normalize_by_std)
        if all(_is_zero(advantage) for advantage in advantages):
            batch.skipped_groups += 1
            continue
        logprobs = group.get("inference_logprobs") or [None] * len(scores)
        for tokens, masks, advantage, sequence_logprobs in zip(
            group["tokens"], group["masks"], advantages, logprobs, strict=True
        ):
            datum = build_datum(tokens, masks, advantage, sequence_logprobs, max_length)
            if datum is not None:
                batch.data.append(datum)
                batch.trained_advantages.append(_trained_mean(datum))
    return batch


def _trained_mean(datum: TrainingDatum) -> float:
    """A datum's advantage for the metrics: the mean over its completion tokens (the rollout's, when scalar)."""
    trained = [value for value, flag in zip(datum.advantages, datum.completion_mask, strict=True) if flag]
    return _mean(trained)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _std(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / len(values))


def completion_values(data: Sequence[TrainingDatum], per_datum: Sequence[Sequence[float]]) -> list[float]:
    """The values at completion positions, flattened over all datums."""
    return [
        value
        for datum, values in zip(data, per_datum, strict=True)
        for value, trained in zip(values, datum.completion_mask, strict=True)
        if trained
    ]


def step_metrics(
    batch: PreparedBatch,
    training_logprobs: Sequence[Sequence[float]],
    loss_sum: float,
    learning_rate: float,
) -> dict[str, float]:
    """The metrics of one step (docs/TRAINER.md#metrics). Logprob means are over completion tokens only."""
    sampler = completion_values(batch.data, [datum.sampler_logprobs or [] for datum in batch.data])
    training = completion_values(batch.data, training_logprobs) if training_logprobs else []
    trained_tokens = len(training)
    return {
        "train/loss": loss_sum / trained_tokens if trained_tokens else 0.0,
        "train/learning_rate": learning_rate,
        "reward/mean": _mean(batch.rewards),
        "reward/std": _std(batch.rewards),
        "completion/mean_tokens": _mean([float(length) for length in batch.completion_lengths]),
        "logprobs/mean": _mean(sampler),
        "logprobs/mean_training": _mean(training),
        # reference (sampler) − training, the sign the seed pipeline and tinker-atropos log
        "logprobs/diff": _mean([s - t for t, s in zip(training, sampler, strict=True)]) if training else 0.0,
        "advantages/mean": _mean(batch.trained_advantages),
        "advantages/std": _std(batch.trained_advantages),
        "batch/sequences": float(batch.num_sequences),
        "batch/groups": float(batch.num_groups),
        "batch/skipped_groups": float(batch.skipped_groups),
        "batch/trained_tokens": float(trained_tokens),
    }
