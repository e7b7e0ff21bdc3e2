"""The local backend on the tiny model: sampling and training agree, the loss is the importance-sampling
loss with the ratio clipped (PPO), Adam moves the policy the way the advantages say, and checkpoints restore
exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.backends.base import SamplingRequest
from trainer.backends.local import LocalBackend
from trainer.config import TrainerConfig, parse_config
from trainer.grpo import TrainingDatum, build_datum


def make_config(tiny_model_dir: Path, run_dir: Path, **tinker: object) -> TrainerConfig:
    return parse_config(
        {
            "env": {"rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "backend": "local",
                "base_model": str(tiny_model_dir),
                "run_dir": str(run_dir),
                "inference_port": 1,
                "device": "cpu",
                **tinker,
            },
        }
    )


@pytest.fixture
def backend(tiny_model_dir: Path, tmp_path: Path) -> LocalBackend:
    return LocalBackend(make_config(tiny_model_dir, tmp_path / "run"))


def prompt_tokens(backend: LocalBackend) -> list[int]:
    text = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Echo: 42"}], tokenize=False, add_generation_prompt=True
    )
    return backend.tokenizer.encode(text, add_special_tokens=False)


def datums_for(backend: LocalBackend, prompt: list[int], advantage: float, n: int = 4):
    completions = backend.sample(SamplingRequest(prompt, n=n, max_new_tokens=6, seed=7))
    data = [
        build_datum(
            prompt + c.tokens,
            [-100] * len(prompt) + c.tokens,
            advantage,
            [1.0] * len(prompt) + c.logprobs,
            1024,
        )
        for c in completions
    ]
    return completions, data


def test_sampler_logprobs_equal_the_trainers(backend: LocalBackend) -> None:
    prompt = prompt_tokens(backend)
    completions, data = datums_for(backend, prompt, advantage=1.0)
    assert len(completions) == 4 and all(1 <= len(c.tokens) <= 6 for c in completions)
    recomputed = backend.compute_logprobs(data)
    for completion, datum, row in zip(completions, data, recomputed, strict=True):
        completion_part = [value for value, trained in zip(row, datum.completion_mask, strict=True) if trained]
        assert completion_part == pytest.approx(completion.logprobs, abs=1e-4)


def test_finish_reason_is_real(backend: LocalBackend) -> None:
    prompt = prompt_tokens(backend)
    everything = tuple(range(len(backend.tokenizer)))
    stopped = backend.sample(SamplingRequest(prompt, n=2, max_new_tokens=5, stop_token_ids=everything))
    assert all(c.finish_reason == "stop" and len(c.tokens) == 1 for c in stopped)
    greedy = backend.sample(SamplingRequest(prompt, n=1, max_new_tokens=3, temperature=0.0))[0]
    eos_ids = {backend.tokenizer.eos_token_id}
    assert (greedy.finish_reason == "length") == (len(greedy.tokens) == 3 and greedy.tokens[-1] not in eos_ids)


def completion_mean(rows, datums) -> float:
    values = [v for row, d in zip(rows, datums, strict=True) for v, t in zip(row, d.completion_mask, strict=True) if t]
    return sum(values) / len(values)


@pytest.mark.parametrize("advantage", [0.75, -0.75])
def test_loss_is_importance_sampling_and_adam_follows_the_advantages(backend: LocalBackend, advantage: float) -> None:
    _, data = datums_for(backend, prompt_tokens(backend), advantage=advantage)
    result = backend.forward_backward(data)
    # On-policy the ratio is 1, so the loss is minus the sum of the advantages over completion tokens.
    expected = -sum(sum(d.advantages) for d in data)
    assert result.loss_sum == pytest.approx(expected, abs=1e-4)
    before = completion_mean(backend.compute_logprobs(data), data)
    backend.optim_step(0.05)
    after = completion_mean(backend.compute_logprobs(data), data)
    assert (after - before) * advantage > 0.05


def stale(data: list[TrainingDatum], gap: float) -> list[TrainingDatum]:
    """The same datums as if sampled by weights that found each completion token `gap` nats less likely."""
    return [
        d.with_sampler_logprobs(
            [v - gap if t else v for v, t in zip(d.sampler_logprobs, d.completion_mask, strict=True)]
        )
        for d in data
    ]


def test_ppo_stops_pushing_tokens_already_far_likelier_than_sampled(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The local default: a ratio above clip_high with a positive advantage gives no gradient (no overshoot)."""
    clipped = LocalBackend(make_config(tiny_model_dir, tmp_path / "ppo"))
    assert clipped._config.loss.name == "ppo"
    _, data = datums_for(clipped, prompt_tokens(clipped), advantage=1.0)
    data = stale(data, gap=2.0)  # ratio e² ≈ 7.4 on every completion token
    result = clipped.forward_backward(data)
    assert result.loss_sum == pytest.approx(-1.2 * sum(sum(d.advantages) for d in data), abs=1e-4)
    before = clipped.compute_logprobs(data)
    clipped.optim_step(0.05)
    assert clipped.compute_logprobs(data) == before

    unclipped = LocalBackend(make_config(tiny_model_dir, tmp_path / "is", loss_fn="importance_sampling"))
    unclipped.forward_backward(data)
    start = completion_mean(unclipped.compute_logprobs(data), data)
    unclipped.optim_step(0.05)
    assert completion_mean(unclipped.compute_logprobs(data), data) > start + 0.05


def test_publishing_is_in_process_and_sampling_sees_the_new_weights(backend: LocalBackend) -> None:
    prompt = prompt_tokens(backend)
    _, data = datums_for(backend, prompt, advantage=1.0)
    base_weights = backend.model.get_base_model().model.embed_tokens.weight
    backend.forward_backward(data)
    backend.optim_step(0.05)
    published = backend.publish_weights(1)
    assert published.version == 1 and backend.published.version == 1
    assert backend.model.get_base_model().model.embed_tokens.weight is base_weights  # never reloaded
    completions, fresh = datums_for(backend, prompt, advantage=1.0)
    for completion, datum, row in zip(completions, fresh, backend.compute_logprobs(fresh), strict=True):
        trained = [v for v, t in zip(row, datum.completion_mask, strict=True) if t]
        assert trained == pytest.approx(completion.logprobs, abs=1e-4)


def test_checkpoint_restores_weights_and_optimizer(backend: LocalBackend, tiny_model_dir: Path) -> None:
    prompt = prompt_tokens(backend)
    _, data = datums_for(backend, prompt, advantage=1.0)
    backend.forward_backward(data)
    backend.optim_step(0.05)
    checkpoint = backend.save_checkpoint(3)
    assert Path(checkpoint.path).name == "step_3" and checkpoint.weights == checkpoint.path
    assert (Path(checkpoint.path) / "adapter_model.safetensors").exists()
    restored = LocalBackend(backend._config, resume_from=checkpoint)
    flat = [value for row in restored.compute_logprobs(data) for value in row]
    assert flat == pytest.approx([value for row in backend.compute_logprobs(data) for value in row], abs=1e-6)
    fresh = LocalBackend(backend._config)  # without the checkpoint: the untrained adapter differs
    assert [value for row in fresh.compute_logprobs(data) for value in row] != pytest.approx(flat, abs=1e-6)
    saved_state = backend._optimizer.state_dict()["state"]
    restored_state = restored._optimizer.state_dict()["state"]
    assert saved_state.keys() == restored_state.keys()
    first = next(iter(saved_state))
    assert torch.equal(saved_state[first]["exp_avg"], restored_state[first]["exp_avg"])


def test_concurrent_requests_of_different_prompts_are_batched_and_keep_exact_logprobs(backend: LocalBackend) -> None:
    """Requests waiting together are sampled as one left-padded batch: each completion's logprobs are still the
    trainer's for that prompt alone, so the padding never leaks into another request's rows."""
    import threading

    tokenizer = backend.tokenizer
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "Echo: " + "7" * length}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )
        for length in (1, 5, 12)
    ]
    results: dict[int, list] = {}
    threads = [
        threading.Thread(
            target=lambda i=i, p=p: results.__setitem__(i, backend.sample(SamplingRequest(p, n=3, max_new_tokens=5)))
        )
        for i, p in enumerate(prompts)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == [0, 1, 2]
    for index, prompt in enumerate(prompts):
        completions = results[index]
        assert len(completions) == 3 and all(c.weights_version == 0 for c in completions)
        data = [
            build_datum(prompt + c.tokens, [-100] * len(prompt) + c.tokens, 1.0, [1.0] * len(prompt) + c.logprobs, 1024)
            for c in completions
        ]
        for completion, datum, row in zip(completions, data, backend.compute_logprobs(data), strict=True):
            trained = [v for v, t in zip(row, datum.completion_mask, strict=True) if t]
            assert trained == pytest.approx(completion.logprobs, abs=1e-4)
