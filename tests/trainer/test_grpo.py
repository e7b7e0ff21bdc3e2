"""GRPO batch preparation and step metrics, tested directly (pure functions, no I/O)."""

from __future__ import annotations

import math
import statistics

import pytest

from rlctl.trainer.grpo import PROMPT_MASK, PolicyLoss, UnsupportedBatch, build_datum, prepare_batch, step_metrics
from rlctl.trajectories.grpo import group_advantages


def rollout(prompt: list[int], completion: list[int], logprobs: list[float]) -> tuple[list, list, list]:
    """(tokens, masks, inference_logprobs) as atroposlib's managed server builds them."""
    tokens = prompt + completion
    masks = [PROMPT_MASK] * len(prompt) + completion
    return tokens, masks, [1.0] * len(prompt) + logprobs


def test_advantages_are_score_minus_group_mean() -> None:
    assert group_advantages([1.0, 0.0, 0.5, 0.5]) == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert group_advantages([2.0, 2.0]) == (0.0, 0.0)


def test_datum_shifts_tokens_and_zeroes_advantages_on_prompt_positions() -> None:
    tokens, masks, logprobs = rollout([10, 11, 12], [20, 21], [-0.5, -1.5])
    datum = build_datum(tokens, masks, 0.25, logprobs, max_length=100)
    assert datum is not None
    assert datum.input_tokens == [10, 11, 12, 20]
    assert datum.target_tokens == [11, 12, 20, 21]
    assert datum.advantages == [0.0, 0.0, 0.25, 0.25]
    assert datum.completion_mask == [False, False, True, True]
    assert datum.sampler_logprobs == [1.0, 1.0, -0.5, -1.5]  # aligned with the targets


def test_datum_without_usable_logprobs_leaves_them_to_the_backend() -> None:
    tokens, masks, logprobs = rollout([1, 2], [3], [-2.0])
    assert build_datum(tokens, masks, 1.0, None, 100).sampler_logprobs is None
    assert build_datum(tokens, masks, 1.0, logprobs[:-1], 100).sampler_logprobs is None  # misaligned


def test_datum_is_truncated_and_dropped_when_nothing_is_left_to_train() -> None:
    tokens, masks, logprobs = rollout([1, 2, 3], [4, 5, 6], [-1.0, -1.0, -1.0])
    truncated = build_datum(tokens, masks, 1.0, logprobs, max_length=5)
    assert truncated.target_tokens == [2, 3, 4, 5]
    assert build_datum(tokens, masks, 1.0, logprobs, max_length=3) is None  # prompt only
    with pytest.raises(ValueError):
        build_datum(tokens, masks[:-1], 1.0, logprobs, 100)


def group(scores: list[float]) -> dict:
    rollouts = [rollout([1, 2], [3 + index, 4], [-1.0, -2.0]) for index in range(len(scores))]
    return {
        "tokens": [r[0] for r in rollouts],
        "masks": [r[1] for r in rollouts],
        "scores": scores,
        "inference_logprobs": [r[2] for r in rollouts],
    }


def test_batch_skips_groups_whose_advantages_are_all_zero() -> None:
    batch = prepare_batch([group([1.0, 0.0]), group([0.5, 0.5]), group([0.0, 1.0, 1.0, 0.0])], 100)
    assert batch.num_groups == 3 and batch.skipped_groups == 1
    assert len(batch.data) == 6
    assert batch.rewards == [1.0, 0.0, 0.5, 0.5, 0.0, 1.0, 1.0, 0.0]
    assert batch.trained_advantages == [0.5, -0.5, -0.5, 0.5, 0.5, -0.5]


def test_step_metrics_are_over_completion_tokens() -> None:
    batch = prepare_batch([group([1.0, 0.0])], 100)
    training = [[0.0, -1.5, -2.5], [0.0, -0.5, -1.5]]  # per target; the first target is a prompt token
    metrics = step_metrics(batch, training, loss_sum=-2.0, learning_rate=0.01)
    assert metrics["reward/mean"] == 0.5
    assert metrics["logprobs/mean"] == pytest.approx(-1.5)  # sampler: -1, -2, -1, -2
    assert metrics["logprobs/mean_training"] == pytest.approx(-1.5)
    assert metrics["logprobs/diff"] == pytest.approx(0.0)
    assert metrics["train/loss"] == pytest.approx(-0.5)  # per completion token
    assert metrics["advantages/mean"] == 0.0 and metrics["advantages/std"] == pytest.approx(0.5)
    assert metrics["train/learning_rate"] == 0.01
    assert all(math.isfinite(value) for value in metrics.values())


def test_kl_is_averaged_over_the_tokens_it_was_measured_on() -> None:
    """Without a penalty the backend measures KL on part of the step only: its mean is over those tokens."""
    batch = prepare_batch([group([1.0, 0.0])], 100)
    training = [[0.0, -1.0, -2.0], [0.0, -1.0, -2.0]]
    stats = {"entropy_sum": 8.0, "tokens": 4.0, "kl_sum": 0.6, "kl_tokens": 2.0}
    metrics = step_metrics(batch, training, 0.0, 0.01, token_stats=stats)
    assert metrics["policy/entropy"] == pytest.approx(2.0)
    assert metrics["kl/reference"] == pytest.approx(0.3)
    unmeasured = step_metrics(batch, training, 0.0, 0.01, token_stats={"entropy_sum": 8.0, "tokens": 4.0})
    assert "kl/reference" not in unmeasured


def test_logprob_difference_is_reference_minus_training() -> None:
    batch = prepare_batch([group([1.0, 0.0])], 100)
    training = [[0.0, -1.25, -2.25], [0.0, -1.25, -2.25]]  # each completion token 0.25 below the sampler
    sampler = [-1.0, -2.0, -1.0, -2.0]
    metrics = step_metrics(batch, training, loss_sum=0.0, learning_rate=0.01)
    expected = statistics.fmean(s - t for s, t in zip(sampler, [-1.25, -2.25, -1.25, -2.25], strict=True))
    assert metrics["logprobs/diff"] == pytest.approx(expected) == pytest.approx(0.25)


def test_advantages_are_normalised_only_when_asked() -> None:
    plain = prepare_batch([group([1.0, 0.0, 0.0, 0.0])], 100)
    normalised = prepare_batch([group([1.0, 0.0, 0.0, 0.0])], 100, normalize_by_std=True)
    assert plain.trained_advantages == [0.75, -0.25, -0.25, -0.25]
    std = statistics.pstdev([1.0, 0.0, 0.0, 0.0])
    assert normalised.trained_advantages == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])


def test_importance_sampling_weighs_the_advantage_by_the_unclipped_ratio() -> None:
    loss = PolicyLoss("importance_sampling")
    assert loss.token_loss(math.log(3.0), 0.0, 0.5) == pytest.approx(-1.5)
    assert loss.token_loss(0.0, 0.0, -2.0) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected"),
    [
        (1.0, 1.0, -1.0),  # on policy: the same as importance sampling
        (3.0, 1.0, -1.2),  # already much likelier than sampled: no further push (clipped, constant)
        (0.1, 1.0, -0.1),  # much less likely than sampled: the ratio stays, so the gradient restores it
        (0.1, -1.0, 0.8),  # a bad token already rarer: clipped, no further push
        (3.0, -1.0, 3.0),  # a bad token now likelier: the whole ratio, pushed down hard
    ],
)
def test_ppo_clips_the_ratio_and_takes_the_smaller_objective(ratio: float, advantage: float, expected: float) -> None:
    assert PolicyLoss("ppo").token_loss(math.log(ratio), 0.0, advantage) == pytest.approx(expected)


def test_summed_loss_covers_every_target_token() -> None:
    datum = build_datum([1, 2, 3, 4], [PROMPT_MASK, PROMPT_MASK, 3, 4], 1.0, [0.0, 0.0, -1.0, -1.0], 16)
    assert datum is not None
    current = [[0.0, -1.0 + math.log(2.0), -1.0]]  # ratios 1 (prompt, advantage 0), 2 and 1
    assert PolicyLoss("importance_sampling").summed([datum], current) == pytest.approx(-3.0)
    assert PolicyLoss("ppo").summed([datum], current) == pytest.approx(-2.2)


def test_per_token_advantages_take_precedence_over_scores() -> None:
    rows = [[9.0, 9.0, 0.5, -0.25], [9.0, 9.0, -1.0, 2.0]]  # prompt positions' values are never trained
    batch = prepare_batch([{**group([1.0, 0.0]), "advantages": rows}], 100)
    assert [datum.advantages for datum in batch.data] == [[0.0, 0.5, -0.25], [0.0, -1.0, 2.0]]
    assert batch.trained_advantages == [0.125, 0.5]  # the mean over completion tokens
    assert batch.rewards == [1.0, 0.0]  # scores are still the reward
    equal_scores = prepare_batch([{**group([0.5, 0.5]), "advantages": rows}], 100)
    assert equal_scores.skipped_groups == 0 and len(equal_scores.data) == 2  # not skipped: the rows differ


def test_set_advantage_to_zero_keeps_a_rollout_out_of_training() -> None:
    overrides = [{"set_advantage_to_zero": True}, {}, {"set_advantage_to_zero": False}]
    batch = prepare_batch([{**group([1.0, 0.0, 0.5]), "overrides": overrides}], 100)
    assert [datum.advantages[-1] for datum in batch.data] == [0.0, -0.5, 0.0]
    silenced = prepare_batch([{**group([1.0, 0.0]), "overrides": [{"set_advantage_to_zero": True}] * 2}], 100)
    assert silenced.skipped_groups == 1 and not silenced.data


def test_absent_fields_as_atropos_sends_them_are_accepted() -> None:
    empty = {"advantages": [], "ref_logprobs": None, "overrides": [], "group_overrides": {"group_size": 2}}
    batch = prepare_batch([{**group([1.0, 0.0]), **empty, "images": [], "distill_logprobs": None}], 100)
    assert batch.trained_advantages == [0.5, -0.5]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("ref_logprobs", [[-1.0] * 4, [-1.0] * 4], "ref_logprobs"),
        ("distill_token_ids", [[[1]] * 4, [[1]] * 4], "distill_token_ids"),
        ("distill_logprobs", [[[-1.0]] * 4, [[-1.0]] * 4], "distill_logprobs"),
        ("images", ["data:image/png;base64,AA"], "images"),
        ("overrides", [{"temperature": 0.5}, {}], "temperature"),
        ("group_overrides", {"sft": True}, "sft"),
        ("advantages", [[1.0] * 3, [1.0] * 4], "3 entries for 4 tokens"),
    ],
)
def test_fields_the_trainer_cannot_honour_refuse_the_whole_batch(field: str, value: object, named: str) -> None:
    with pytest.raises(UnsupportedBatch, match=named) as refused:
        prepare_batch([group([1.0, 0.0]), {**group([1.0, 0.0]), field: value}], 100)
    assert refused.value.kind == "unsupported_batch"


def test_gspo_clips_one_ratio_per_sequence() -> None:
    tokens, masks, logprobs = rollout([1, 2], [3, 4], [0.0, 0.0])
    datum = build_datum(tokens, masks, 1.0, logprobs, 100)
    # token ratios e^0.4 and e^0: the sequence ratio is their geometric mean e^0.2 ≈ 1.22, clipped to 1.2
    current = [1.0, 0.4, 0.0]
    loss = PolicyLoss("gspo", 0.8, 1.2)
    assert loss.summed([datum], [current]) == pytest.approx(-2 * 1.2)
    assert PolicyLoss("gspo", 0.8, 1.5).summed([datum], [current]) == pytest.approx(-2 * math.exp(0.2))


def test_cross_entropy_is_the_weighted_logprob_whatever_the_sampler_gave() -> None:
    tokens, masks, logprobs = rollout([1, 2], [3, 4], [-0.5, -2.0])
    datum = build_datum(tokens, masks, 1.0, logprobs, 100)
    other = build_datum(tokens, masks, 1.0, [1.0, 1.0, -0.1, -0.1], 100)
    current = [-3.0, -0.4, -0.7]
    loss = PolicyLoss("cross_entropy")
    # the completion's two tokens, weighted 1; the prompt's none
    assert loss.summed([datum], [current]) == pytest.approx(0.4 + 0.7)
    assert loss.summed([other], [current]) == loss.summed([datum], [current])
    unkept = build_datum(tokens, masks, 0.0, logprobs, 100)
    assert loss.summed([unkept], [current]) == 0.0


@pytest.mark.parametrize(
    ("normalization", "expected"),
    [("group_mean", [0.5, -0.5, -0.5, 0.5]), ("mean_std", [1.0, -1.0, -1.0, 1.0]), ("none", [1.0, 0.0, 0.0, 1.0])],
)
def test_advantage_normalizations(normalization: str, expected: list[float]) -> None:
    scores = [1.0, 0.0, 0.0, 1.0]
    rollouts = [rollout([1, 2], [3, 4], [-1.0, -1.0]) for _ in scores]
    groups = [
        {
            "tokens": [r[0] for r in rollouts],
            "masks": [r[1] for r in rollouts],
            "scores": scores,
            "inference_logprobs": [r[2] for r in rollouts],
        }
    ]
    batch = prepare_batch(groups, 100, normalization=normalization)
    assert batch.trained_advantages == pytest.approx(expected)


def test_truncated_completions_are_counted_and_masked_when_asked() -> None:
    stop = frozenset({9})
    ended, cut = rollout([1, 2], [3, 9], [-1.0, -1.0]), rollout([1, 2], [3, 4], [-1.0, -1.0])
    groups = [
        {
            "tokens": [ended[0], cut[0]],
            "masks": [ended[1], cut[1]],
            "scores": [0.0, 1.0],
            "inference_logprobs": [ended[2], cut[2]],
        }
    ]
    kept = prepare_batch(groups, 100, stop_ids=stop)
    assert kept.truncated == 1 and kept.trained_advantages == pytest.approx([-0.5, 0.5])
    masked = prepare_batch(groups, 100, stop_ids=stop, mask_truncated=True)
    assert masked.trained_advantages == pytest.approx([-0.5])  # the truncated one is left out of the loss
    metrics = step_metrics(masked, [[0.0, 0.0, 0.0]], 0.0, 1e-3, PolicyLoss("ppo"))
    assert metrics["completion/truncated_share"] == 0.5
    # every token's ratio e^(0 - -1) = e ≈ 2.7 > 1.2 on both completion tokens; the prompt position does not count
    assert metrics["policy/clip_fraction"] == 1.0
    # the length limit truncates too, stop tokens known or not
    assert prepare_batch(groups, 3).truncated == 2
