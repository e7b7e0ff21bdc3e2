"""Training options end to end (docs/TRAINER.md#training-options), all real processes as in the echo pipeline:
each policy loss trains `echo` to a higher reward than it started with, and a KL penalty to the reference model
(the base with the adapter off) keeps the policy measurably closer to it than the same run without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.pipeline import child_environment, run_pipeline, step_metrics

TOTAL_STEPS = 24
QUARTER = TOTAL_STEPS // 4


def train(tmp_path: Path, model_dir: Path, name: str, **tinker: object) -> list[dict[str, float]]:
    run_dir = tmp_path / name
    run = run_pipeline(
        run_dir,
        model_dir=model_dir,
        total_steps=TOTAL_STEPS,
        environment=child_environment(tmp_path / "var"),
        timeout_s=240,
        env={"seed": 0, "steps_per_eval": 12},
        tinker={"seed": 0, **tinker},
    )
    assert run.exit_code == 0, run.trainer.log_tail()
    return [record["metrics"] for record in step_metrics(run_dir)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "gspo"])
def test_each_loss_trains_echo_to_a_higher_reward(tiny_model_dir: Path, tmp_path: Path, loss_fn: str) -> None:
    metrics = train(tmp_path, tiny_model_dir, loss_fn, loss_fn=loss_fn)
    rewards = [step["reward/mean"] for step in metrics]
    first, last = mean(rewards[:QUARTER]), mean(rewards[-QUARTER:])
    print(f"{loss_fn}: first-quarter mean reward {first:.3f}, last-quarter {last:.3f}")
    assert last >= first + 0.05, rewards
    assert all("completion/truncated_share" in step for step in metrics)
    # a step whose groups were all skipped (every rollout scored alike, as a policy that has learnt makes them)
    # trains nothing, so it has no policy to measure; every step that trained has the policy's metrics
    trained = [step for step in metrics if step["batch/trained_tokens"] > 0]
    assert len(trained) >= len(metrics) // 2, [step["batch/skipped_groups"] for step in metrics]
    for name in ("policy/entropy", "policy/clip_fraction"):
        assert all(name in step for step in trained), name
    assert all(0.0 <= step["policy/clip_fraction"] <= 1.0 for step in trained)
    assert all(step["policy/entropy"] > 0 for step in trained)


def test_a_kl_penalty_keeps_the_policy_closer_to_the_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    free = train(tmp_path, tiny_model_dir, "no-kl")
    held = train(tmp_path, tiny_model_dir, "kl", kl_coef=1.0)
    # the first step trains from the base itself: no distance yet in either
    assert free[0]["kl/reference"] == pytest.approx(0.0, abs=1e-6)
    assert held[0]["kl/reference"] == pytest.approx(0.0, abs=1e-6)
    # without a penalty the metric is measured on steps 1, 11, 21 (KL_METRIC_EVERY); with one, on every step that
    # trained (a step whose groups were all skipped trains nothing, so measures nothing)
    assert all(("kl/reference" in s) == (s["batch/trained_tokens"] > 0) for s in held)
    measured = [i + 1 for i, s in enumerate(free) if "kl/reference" in s]
    assert measured[0] == 1 and set(measured) <= {1, 11, 21}, measured
    later = [step for step in measured[1:] if "kl/reference" in held[step - 1]]
    assert later, (measured, [s["batch/trained_tokens"] for s in held])
    free_kl, held_kl = (
        mean([free[step - 1]["kl/reference"] for step in later]),
        mean([held[step - 1]["kl/reference"] for step in later]),
    )
    print(f"KL to the reference at steps {later}: without penalty {free_kl:.4f}, with kl_coef 1.0 {held_kl:.4f}")
    assert held_kl < free_kl, (held_kl, free_kl)
