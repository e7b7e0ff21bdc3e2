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

from rlctl.trainer.defaults import DEFAULT_ADVANTAGE_NORMALIZATION, PPO_CLIP_HIGH, PPO_CLIP_LOW
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
    truncated: int = 0  # rollouts whose completion has no stop token or was cut at the trainer's length

    @property
    def num_sequences(self) -> int:
        return len(self.rewards)


@dataclass(frozen=True)
class PolicyLoss:
    """The per-token loss of a step (docs/TRAINER.md#grpo-step), by Tinker's names: `importance_sampling` weighs
    the advantage by the ratio of current to sampler probability; `ppo` clips that ratio to [clip_low, clip_high]
    and takes the smaller objective, so a token the policy already moved far from its sampler pushes no further;
    `gspo` clips one ratio per sequence, the geometric mean of its tokens' ratios (GSPO), the same on every token;
    `cross_entropy` is the supervised loss, -advantage x logprob with no ratio (an `sft` run's advantages are its
    kept records' 1 and the others' 0: docs/RUNS.md#supervised-warm-up)."""

    name: str = "importance_sampling"
    clip_low: float = PPO_CLIP_LOW
    clip_high: float = PPO_CLIP_HIGH

    def token_loss(self, logprob: float, sampler_logprob: float, advantage: float) -> float:
        if self.name == "cross_entropy":
            return -advantage * logprob
        return self._clipped_loss(math.exp(logprob - sampler_logprob), advantage, self.name != "importance_sampling")

    def _clipped_loss(self, ratio: float, advantage: float, clipped: bool) -> float:
        if clipped:
            bounded = min(max(ratio, self.clip_low), self.clip_high)
            return -min(ratio * advantage, bounded * advantage)
        return -ratio * advantage

    def tinker_config(self) -> dict[str, float] | None:
        """Tinker's `loss_fn_config` for this loss."""
        if self.name != "ppo":
            return None
        return {"clip_low_threshold": self.clip_low, "clip_high_threshold": self.clip_high}

    def datum_loss(self, datum: TrainingDatum, logprobs: Sequence[float]) -> float:
        """The loss summed over the datum's target tokens."""
        sampled = datum.sampler_logprobs or []
        if self.name != "gspo":
            return sum(
                self.token_loss(current, old, advantage)
                for current, old, advantage in zip(logprobs, sampled, datum.advantages, strict=True)
            )
        diffs = [c - o for c, o, kept in zip(logprobs, sampled, datum.completion_mask, strict=True) if kept]
        ratio = math.exp(sum(diffs) / len(diffs)) if diffs else 1.0
        return sum(self._clipped_loss(ratio, advantage, True) for advantage in datum.advantages if advantage)

    def summed(self, data: Sequence[TrainingDatum], logprobs: Sequence[Sequence[float]]) -> float:
        """The loss summed over every target token of every datum."""
        return sum(self.datum_loss(datum, row) for datum, row in zip(data, logprobs, strict=True))


def advantages_of(scores: Sequence[float], normalization: str) -> tuple[float, ...]:
    """A group's advantages: reward - group mean (`group_mean`), that over the group's std (`mean_std`), or the
    rewards themselves (`none`)."""
    if normalization == "none":
        return tuple(float(score) for score in scores)
    return group_advantages(scores, normalization == "mean_std")


def is_truncated(tokens: Sequence[int], max_length: int, stop_ids: frozenset[int]) -> bool:
    """A completion ended by the length limit: cut at the trainer's `max_length`, or (when the stop tokens are
    known) not ending in one."""
    return len(tokens) > max_length or (bool(stop_ids) and (not tokens or tokens[-1] not in stop_ids))


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


def rollout_advantages(group: dict[str, Any], normalization: str) -> list[float | list[float]]:
    """Each rollout's advantage: the environment's per-token row when it sent `advantages` (its tokens' order),
    else the GRPO advantage of its score; zero for a rollout whose override says `set_advantage_to_zero`."""
    advantages: list[float | list[float]]
    if _present(group.get("advantages")):
        advantages = [[float(value) for value in row] for row in group["advantages"]]
    else:
        advantages = list(advantages_of([float(score) for score in group["scores"]], normalization))
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


def prepare_batch(
    groups: Sequence[dict[str, Any]],
    max_length: int,
    normalize_by_std: bool = False,
    *,
    normalization: str | None = None,
    mask_truncated: bool = False,
    stop_ids: frozenset[int] = frozenset(),
) -> PreparedBatch:
    """Datums for every rollout of every group whose advantages are not all zero. Every group is checked first,
    so a batch with a field the trainer cannot honour trains nothing (UnsupportedBatch). `normalization` (an
    ADVANTAGE_NORMALIZATIONS name) overrides `normalize_by_std`; with `mask_truncated` a truncated completion gives
    no datum (it still counts in its group's mean)."""
    normalization = normalization or ("mean_std" if normalize_by_std else DEFAULT_ADVANTAGE_NORMALIZATION)
    for group in groups:
        check_group(group)
    batch = PreparedBatch(num_groups=len(groups))
    for group in groups:
        scores = [float(score) for score in group["scores"]]
        batch.rewards.extend(scores)
        batch.completion_lengths.extend(sum(1 for mask in masks if mask != PROMPT_MASK) for masks in group["masks"])
        truncated = [is_truncated(tokens, max_length, stop_ids) for tokens in group["tokens"]]
        batch.truncated += sum(truncated)
        advantages = rollout_advantages(group, normalization)
        if mask_truncated:
            advantages = [0.0 if cut else value for value, cut in zip(advantages, truncated, strict=True)]
        if all(_is_zero(advantage) for advantage in advantages):
            batch.skipped_groups += 1
            continue
        logprobs = group.get("inference_logprobs") or [None] * len(scores)
        for tokens, masks, advantage, sequence_logprobs, cut in zip(
            group["tokens"], group["masks"], advantages, logprobs, truncated, strict=True
        ):
            if cut and mask_truncated:  # out of the loss altogether (the KL term included)
                continue
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


def clip_fraction(
    data: Sequence[TrainingDatum], training: Sequence[Sequence[float]], clip_low: float, clip_high: float
) -> float:
    """Share of completion tokens whose ratio of training to sampler probability lies outside the clip range."""
    ratios = [
        math.exp(current - sampled)
        for datum, row in zip(data, training, strict=True)
        for current, sampled, kept in zip(row, datum.sampler_logprobs or [], datum.completion_mask, strict=True)
        if kept
    ]
    return sum(1 for ratio in ratios if not clip_low <= ratio <= clip_high) / len(ratios) if ratios else 0.0


def step_metrics(
    batch: PreparedBatch,
    training_logprobs: Sequence[Sequence[float]],
    loss_sum: float,
    learning_rate: float,
    loss: PolicyLoss | None = None,
    token_stats: dict[str, float] | None = None,
) -> dict[str, float]:
    """The metrics of one step (docs/TRAINER.md#metrics). Logprob means are over completion tokens only.
    `token_stats`: sums over completion tokens the backend measured (`entropy_sum` over `tokens`, `kl_sum` over
    `kl_tokens`)."""
    sampler = completion_values(batch.data, [datum.sampler_logprobs or [] for datum in batch.data])
    training = completion_values(batch.data, training_logprobs) if training_logprobs else []
    trained_tokens = len(training)
    loss = loss or PolicyLoss()
    metrics = {
        "train/loss": loss_sum / trained_tokens if trained_tokens else 0.0,
        "train/learning_rate": learning_rate,
        "reward/mean": _mean(batch.rewards),
        "reward/std": _std(batch.rewards),
        "completion/mean_tokens": _mean([float(length) for length in batch.completion_lengths]),
        "completion/truncated_share": batch.truncated / batch.num_sequences if batch.num_sequences else 0.0,
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
    if training_logprobs:
        metrics["policy/clip_fraction"] = clip_fraction(batch.data, training_logprobs, loss.clip_low, loss.clip_high)
    stats = token_stats or {}
    if stats.get("tokens") and "entropy_sum" in stats:
        metrics["policy/entropy"] = stats["entropy_sum"] / stats["tokens"]
    if stats.get("kl_tokens"):
        metrics["kl/reference"] = stats["kl_sum"] / stats["kl_tokens"]
    return metrics
