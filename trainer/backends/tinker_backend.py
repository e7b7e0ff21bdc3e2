"""The `tinker` backend: the Tinker training service through the `tinker` SDK.

The service URL comes from `TINKER_BASE_URL` (any server speaking the Tinker protocol) or the SDK default; the
key from `TINKER_API_KEY`, passed in the environment only. After each step the weights are saved for sampling
and the inference server switches to the new sampling client.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainer.backends.base import (
    Checkpoint,
    Completion,
    ForwardBackwardResult,
    PublishedWeights,
    SamplingRequest,
    TrainingBackend,
)
from trainer.config import TrainerConfig
from trainer.defaults import ADAM_BETA1, ADAM_BETA2, ADAM_EPS
from trainer.grpo import TrainingDatum

if TYPE_CHECKING:  # imported when the backend starts: the SDK is slow to import
    import tinker

log = logging.getLogger(__name__)

# Generous: a real service may queue work for minutes; a broken one must not hang the trainer forever.
RESULT_TIMEOUT_S = 3600.0


class BackendConfigurationError(RuntimeError):
    """The backend cannot start with what the environment provides."""


def require_api_key() -> None:
    if not os.environ.get("TINKER_API_KEY"):
        raise BackendConfigurationError(
            "TINKER_API_KEY is not set: the tinker backend needs a Tinker API key in the trainer's "
            "environment (and TINKER_BASE_URL for a self-hosted Tinker-compatible server), "
            "or use backend: local"
        )


class TinkerBackend(TrainingBackend):
    name = "tinker"

    def __init__(self, config: TrainerConfig, resume_from: Checkpoint | None = None) -> None:
        require_api_key()
        import tinker
        from transformers import AutoTokenizer

        if not config.base_model:
            raise BackendConfigurationError("tinker.base_model must name a Tinker base model")
        self._tinker = tinker
        self.model_name = config.base_model
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_name or config.base_model)
        self._service = tinker.ServiceClient(display_name=config.wandb_run_name)
        if resume_from is not None:
            future = self._service.create_training_client_from_state_with_optimizer(resume_from.path)
        else:
            future = self._service.create_lora_training_client(
                base_model=config.base_model, rank=config.lora_rank, seed=config.seed
            )
        self._training = future.result(timeout=RESULT_TIMEOUT_S)
        self._sampler_lock = threading.Lock()
        self._sampler: tinker.SamplingClient | None = None
        log.info("tinker training client ready for %s (model id %s)", config.base_model, self._training.model_id)

    def _datum(self, datum: TrainingDatum, with_advantages: bool) -> tinker.Datum:
        types = self._tinker.types
        inputs: dict[str, list[int] | list[float]] = {"target_tokens": list(datum.target_tokens)}
        if with_advantages:
            inputs["logprobs"] = list(datum.sampler_logprobs or [0.0] * len(datum.target_tokens))
            inputs["advantages"] = list(datum.advantages)
        else:
            inputs["weights"] = [1.0] * len(datum.target_tokens)
        return types.Datum(model_input=types.ModelInput.from_ints(list(datum.input_tokens)), loss_fn_inputs=inputs)

    @staticmethod
    def _logprobs(output: tinker.ForwardBackwardOutput) -> list[list[float]]:
        return [[float(value) for value in entry["logprobs"].data] for entry in output.loss_fn_outputs]

    def compute_logprobs(self, data: Sequence[TrainingDatum]) -> list[list[float]]:
        datums = [self._datum(datum, with_advantages=False) for datum in data]
        output = self._training.forward(datums, "cross_entropy").result(timeout=RESULT_TIMEOUT_S)
        return self._logprobs(output)

    def forward_backward(self, data: Sequence[TrainingDatum]) -> ForwardBackwardResult:
        datums = [self._datum(datum, with_advantages=True) for datum in data]
        output = self._training.forward_backward(datums, "importance_sampling").result(timeout=RESULT_TIMEOUT_S)
        logprobs = self._logprobs(output)
        loss_sum = output.metrics.get("loss:sum")
        if loss_sum is None:  # compute it as the service defines it
            loss_sum = _importance_sampling_loss(data, logprobs)
        return ForwardBackwardResult(loss_sum=float(loss_sum), logprobs=logprobs)

    def optim_step(self, learning_rate: float) -> None:
        params = self._tinker.AdamParams(learning_rate=learning_rate, beta1=ADAM_BETA1, beta2=ADAM_BETA2, eps=ADAM_EPS)
        self._training.optim_step(params).result(timeout=RESULT_TIMEOUT_S)

    def publish_weights(self, step: int) -> PublishedWeights:
        sampler = self._training.save_weights_and_get_sampling_client().result(timeout=RESULT_TIMEOUT_S)
        with self._sampler_lock:
            self._sampler = sampler
            self.published = PublishedWeights(version=step, reference=getattr(sampler, "_sampling_session_id", None))
        return self.published

    def save_checkpoint(self, step: int) -> Checkpoint:
        name = f"step_{step}"
        state = self._training.save_state(name).result(timeout=RESULT_TIMEOUT_S)
        weights = self._training.save_weights_for_sampler(name).result(timeout=RESULT_TIMEOUT_S)
        return Checkpoint(step=step, path=state.path, weights=weights.path)

    def sample(self, request: SamplingRequest) -> list[Completion]:
        with self._sampler_lock:
            sampler = self._sampler
        if sampler is None:
            raise RuntimeError("no weights have been published for sampling yet")
        types = self._tinker.types
        stop: list[str] | list[int] | None = list(request.stop) or list(request.stop_token_ids) or None
        params = types.SamplingParams(
            max_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=stop,
            seed=request.seed,
        )
        response = sampler.sample(
            prompt=types.ModelInput.from_ints(list(request.prompt_tokens)),
            num_samples=request.n,
            sampling_params=params,
            topk_sample_logprobs=request.top_logprobs,
        ).result(timeout=RESULT_TIMEOUT_S)
        return [self._completion(sequence, request) for sequence in response.sequences]

    def _completion(self, sequence: tinker.SampledSequence, request: SamplingRequest) -> Completion:
        tokens = list(sequence.tokens)
        matched: str | int | None = None
        if sequence.stop_reason == "stop":
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            matched = next((s for s in request.stop if s and s in text), tokens[-1] if tokens else None)
        top = sequence.topk_logprobs if request.top_logprobs else None
        return Completion(
            tokens=tokens,
            logprobs=[float(value) for value in (sequence.logprobs or [])],
            finish_reason="stop" if sequence.stop_reason == "stop" else "length",
            top_logprobs=[list(position or []) for position in top] if top is not None else None,
            matched_stop=matched,
        )

    def close(self) -> None:
        try:
            self._service.close("success").result(timeout=30)
        except Exception as error:  # closing is best effort; the session expires without heartbeats
            log.warning("closing the tinker session failed: %s", error)


def _importance_sampling_loss(data: Sequence[TrainingDatum], logprobs: Sequence[Sequence[float]]) -> float:
    import math

    return -sum(
        math.exp(current - sampled) * advantage
        for datum, row in zip(data, logprobs, strict=True)
        for current, sampled, advantage in zip(row, datum.sampler_logprobs or [], datum.advantages, strict=True)
    )
