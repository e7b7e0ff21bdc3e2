"""The SDK basics against SkyRL through rlctl's `tinker` backend: train, save, sample, resume.

The backend detects that SkyRL speaks the tinker 0.25 protocol and uses that API subset; the numbers checked are
the ones a trainer depends on: the sampler's logprobs equal the trainer's, training moves the rewarded completions
up, a resumed model has the saved weights and the saved optimiser state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.trainer.backends.base import Completion, SamplingRequest
from rlctl.trainer.backends.tinker_backend import TinkerBackend
from rlctl.trainer.config import TrainerConfig, parse_config
from rlctl.trainer.grpo import TrainingDatum
from tests_skyrl.server import API_KEY, SkyRLServer

PROMPT = [1, 40, 41, 42, 43]
LEARNING_RATE = 0.05
# What rlctl sends and SkyRL 0.4's request schemas have no field for.
IGNORED_BY_SKYRL = {
    "lora_config.train_mlp",
    "lora_config.train_attn",
    "lora_config.train_unembed",
    "adam_params.grad_clip_norm",
    "topk_sample_logprobs",
}


@pytest.fixture
def config(skyrl: SkyRLServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TINKER_BASE_URL", skyrl.url)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def make(**tinker: object) -> TrainerConfig:
        section = {"backend": "tinker", "base_model": str(skyrl.model_dir), "lora_rank": 8, "seed": 0}
        section.update(run_dir=str(tmp_path / "run"), inference_port=1, **tinker)
        return parse_config({"env": {"rollout_server_url": "http://127.0.0.1:1"}, "tinker": section})

    return make


def datum(completion: Completion, advantage: float) -> TrainingDatum:
    tokens = PROMPT + completion.tokens
    mask = [False] * (len(PROMPT) - 1) + [True] * len(completion.tokens)
    return TrainingDatum(
        input_tokens=tokens[:-1],
        target_tokens=tokens[1:],
        advantages=[advantage if on_completion else 0.0 for on_completion in mask],
        completion_mask=mask,
        sampler_logprobs=[0.0] * (len(PROMPT) - 1) + completion.logprobs,
    )


def completion_logprobs(data: list[TrainingDatum], rows: list[list[float]]) -> list[list[float]]:
    return [[v for v, on in zip(row, d.completion_mask, strict=True) if on] for d, row in zip(data, rows, strict=True)]


def flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def train_step(backend: TinkerBackend, data: list[TrainingDatum]) -> None:
    backend.forward_backward(data)
    backend.optim_step(LEARNING_RATE)


def test_train_save_sample_and_resume(config) -> None:
    backend = TinkerBackend(config())
    resumed = None
    try:
        assert backend.protocol == "legacy"
        backend.publish_weights(0)
        request = SamplingRequest(PROMPT, n=4, max_new_tokens=6, temperature=1.0, seed=0, top_logprobs=2)
        completions = backend.sample(request)
        assert len(completions) == 4
        assert all(len(c.logprobs) == len(c.tokens) > 0 for c in completions)
        assert all(c.top_logprobs is None for c in completions)  # asked for, not returned: a run warning

        # The sampler's logprobs are the model's own (temperature 1): the trainer computes the same ones.
        data = [datum(c, 1.0 if index % 2 == 0 else -1.0) for index, c in enumerate(completions)]
        before = completion_logprobs(data, backend.compute_logprobs(data))
        for sampled, computed in zip(completions, before, strict=True):
            assert computed == pytest.approx(sampled.logprobs, abs=1e-4)

        # Training raises the rewarded completions and lowers the others.
        train_step(backend, data)
        train_step(backend, data)
        after = completion_logprobs(data, backend.compute_logprobs(data))
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            assert (sum(new) > sum(old)) == (index % 2 == 0), (old, new)
        published = backend.publish_weights(2)
        assert published.version == 2 and published.reference
        assert len(backend.sample(SamplingRequest(PROMPT, n=2, max_new_tokens=4))) == 2

        checkpoint = backend.save_checkpoint(2)
        assert checkpoint.path.startswith("tinker://") and checkpoint.path.endswith("/weights/step_2")
        assert checkpoint.weights.startswith("tinker://") and checkpoint.weights.endswith("step_2")
        saved = backend.compute_logprobs(data)

        # A resumed model has the saved weights, and the saved Adam moments: one more step lands where the
        # original's does (a fresh optimiser's first step would not).
        resumed = TinkerBackend(config(), resume_from=checkpoint)
        assert flat(resumed.compute_logprobs(data)) == pytest.approx(flat(saved), abs=1e-5)
        train_step(backend, data)
        train_step(resumed, data)
        assert flat(resumed.compute_logprobs(data)) == pytest.approx(flat(backend.compute_logprobs(data)), abs=1e-5)

        assert {warning.parameter for warning in backend.drain_warnings()} == IGNORED_BY_SKYRL
    finally:
        backend.close()
        if resumed is not None:
            resumed.close()


def test_the_current_protocol_cannot_sample_from_skyrl(config) -> None:
    """Why the legacy subset exists: SDK 0.38's own sampling call fails on SkyRL's asample promises."""
    backend = TinkerBackend(config(protocol="current"))
    try:
        backend.publish_weights(0)
        with pytest.raises(AssertionError, match="sample_sequence_ids"):
            backend.sample(SamplingRequest(PROMPT, n=1, max_new_tokens=2))
    finally:
        backend.close()
