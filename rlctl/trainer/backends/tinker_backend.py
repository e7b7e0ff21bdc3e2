"""The `tinker` backend: the Tinker training service, or a self-hosted server speaking its protocol (SkyRL),
through the pinned `tinker` SDK.

The service URL comes from `TINKER_BASE_URL` (any server speaking the Tinker protocol) or the SDK default; the
key from `TINKER_API_KEY`, passed in the environment only. After each step the weights are saved for sampling
and the inference server switches to the new sampling client. The protocol version (`current` or `legacy`) is
chosen by `tinker.protocol` or detected from the server (tinker_protocol.py); the two differ only in resume,
sampling and closing, each of which is one method here.

`TinkerSession` is the connection without a model to train: the protocol, the warnings, sampling through a
sampling client and closing. The backend trains through one; an evaluation samples saved weights and the base
model through one (rlctl/trainer/evaluate.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rlctl.trainer.backends.base import (
    BackendWarning,
    Checkpoint,
    Completion,
    ForwardBackwardResult,
    PublishedWeights,
    SamplingRequest,
    StepOutcome,
    TrainingBackend,
    WarningLog,
    timed_step,
)
from rlctl.trainer.backends.tinker_protocol import (
    SentParameter,
    choose_protocol,
    describe_server,
    ignored_parameters,
)
from rlctl.trainer.config import TrainerConfig
from rlctl.trainer.defaults import ADAM_BETA1, ADAM_BETA2, ADAM_EPS
from rlctl.trainer.grpo import TrainingDatum

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


class TinkerSession:
    """One SDK connection to a Tinker server: the protocol it speaks, warnings about what it ignores, sampling
    through a sampling client (the trainer's newest weights, saved weights or the base model), and closing."""

    def __init__(self, base_model: str | None, tokenizer_name: str | None, protocol: str, display_name: str | None):
        require_api_key()
        import tinker
        from transformers import AutoTokenizer

        if not base_model:
            raise BackendConfigurationError("tinker.base_model must name a Tinker base model")
        self.tinker = tinker
        self.base_model: str = base_model
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_name or base_model)
        self.warnings = WarningLog()
        self.server = describe_server(os.environ.get("TINKER_BASE_URL"))
        self.protocol, reason = choose_protocol(protocol, self.server)
        log.info("tinker protocol: %s (%s)", self.protocol, reason)
        self.service = tinker.ServiceClient(display_name=display_name)
        self._legacy_sample_ids = itertools.count(1)

    def sampling_client(self, model_path: str | None = None) -> tinker.SamplingClient:
        """A sampling client of saved sampler weights (`tinker://…`), or of the base model without a path."""
        if model_path is None:
            future = self.service.create_sampling_client(base_model=self.base_model)
        else:
            future = self.service.create_sampling_client(model_path=model_path)
        return future.result(timeout=RESULT_TIMEOUT_S)

    # --- parameters the server ignores ------------------------------------------------------------

    def warn_ignored(self, sent: list[SentParameter]) -> None:
        for parameter in ignored_parameters(self.server, sent):
            self.warn_parameter(parameter.label, parameter.value, f"its schema for {parameter.route} has no such field")

    def warn_parameter(self, label: str, value: Any, evidence: str) -> None:
        message = f"the training server ignores {label} (rlctl sends {value!r}): {evidence}"
        self.warnings.add(BackendWarning(code="parameter_ignored", message=message, parameter=label))

    # --- sampling ---------------------------------------------------------------------------------

    def sample(self, sampler: tinker.SamplingClient, request: SamplingRequest) -> list[Completion]:
        """`request.n` completions from `sampler`'s weights."""
        types = self.tinker.types
        stop: list[str] | list[int] | None = list(request.stop) or list(request.stop_token_ids) or None
        params = types.SamplingParams(
            max_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=stop,
            seed=request.seed,
        )
        prompt = types.ModelInput.from_ints(list(request.prompt_tokens))
        if request.top_logprobs:
            self.warn_ignored([SentParameter("/api/v1/asample", (), "topk_sample_logprobs", request.top_logprobs)])
        response = self._sample_response(sampler, prompt, request.n, params, request.top_logprobs)
        if request.top_logprobs and any(sequence.topk_logprobs is None for sequence in response.sequences):
            evidence = "a sample that asked for top-k logprobs came back without them"
            self.warn_parameter("topk_sample_logprobs", request.top_logprobs, evidence)
        return [self._completion(sequence, request) for sequence in response.sequences]

    def _sample_response(self, sampler, prompt, num_samples: int, params, top_logprobs: int):
        if self.protocol == "current":
            future = sampler.sample(
                prompt=prompt, num_samples=num_samples, sampling_params=params, topk_sample_logprobs=top_logprobs
            )
            return future.result(timeout=RESULT_TIMEOUT_S)
        return self._legacy_sample(sampler, prompt, num_samples, params, top_logprobs)

    def _legacy_sample(self, sampler, prompt, num_samples: int, params, top_logprobs: int):
        """`asample` + `retrieve_future` with the SDK's own lower-level client and future.

        SDK 0.38's `SamplingClient.sample` asserts that the asample promise carries `sample_sequence_ids`, which a
        0.25-protocol server never sends; the request and the result are otherwise the same, so only the
        stamping of sequence ids (which rlctl does not use) is left out.
        """
        from tinker.lib.api_future_impl import _APIFuture
        from tinker.lib.client_connection_pool_type import ClientConnectionPoolType

        holder = sampler.holder
        request = self.tinker.types.SampleRequest(
            sampling_session_id=sampler._sampling_session_id,
            seq_id=next(self._legacy_sample_ids),
            num_samples=num_samples,
            prompt=prompt,
            sampling_params=params,
            topk_sample_logprobs=top_logprobs,
        )

        async def submit():
            with holder.aclient(ClientConnectionPoolType.SAMPLE) as client:
                return await client.sampling.asample(request=request)

        async def sample():
            promise = await holder.execute_with_retries(submit)
            future = _APIFuture(self.tinker.types.SampleResponse, holder, promise, time.time(), "Sample")
            return await future.result_async()

        return holder.run_coroutine_threadsafe(sample()).result(timeout=RESULT_TIMEOUT_S)

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
        if self.protocol == "legacy":  # no session finish in the 0.25 protocol: it expires without heartbeats
            return
        try:
            self.service.close("success").result(timeout=30)
        except Exception as error:  # closing is best effort; the session expires without heartbeats
            log.warning("closing the tinker session failed: %s", error)


class TinkerBackend(TrainingBackend):
    name = "tinker"

    def __init__(self, config: TrainerConfig, resume_from: Checkpoint | None = None) -> None:
        self._config = config
        self._session = TinkerSession(config.base_model, config.tokenizer_name, config.protocol, config.wandb_run_name)
        self._tinker = self._session.tinker
        self._service = self._session.service
        self.model_name: str = self._session.base_model
        self.tokenizer = self._session.tokenizer
        self._session.warn_ignored(self._configured_parameters())
        if resume_from is None:
            self._training = self._create_lora_client(config.lora_rank)
        else:
            self._training = self._resume(resume_from.path, resume_from.optimizer)
        self._sampler_lock = threading.Lock()
        self._sampler: tinker.SamplingClient | None = None
        log.info("tinker training client ready for %s (model id %s)", config.base_model, self._training.model_id)

    @property
    def protocol(self) -> str:
        return self._session.protocol

    # --- protocol-dependent calls -----------------------------------------------------------------

    def _create_lora_client(self, rank: int):
        future = self._service.create_lora_training_client(
            base_model=self.model_name, rank=rank, seed=self._config.seed
        )
        return future.result(timeout=RESULT_TIMEOUT_S)

    def _resume(self, path: str, with_optimizer: bool = True):
        """A training client with the weights (and, unless a warm start, the optimiser state) saved at `path`."""
        if self.protocol == "current":
            if with_optimizer:
                future = self._service.create_training_client_from_state_with_optimizer(path)
            else:
                future = self._service.create_training_client_from_state(path)
            return future.result(timeout=RESULT_TIMEOUT_S)
        # The 0.25 protocol has no create-via-load: create the model with the checkpoint's rank, then load into it
        # as its first request (what SDK 0.25 did; the 0.38 SDK keeps the call, deprecated, for such servers).
        info = self._tinker.RestClient().get_weights_info_by_tinker_path(path).result(timeout=RESULT_TIMEOUT_S)
        training = self._create_lora_client(info.lora_rank or self._config.lora_rank)
        with _deprecation_notice_silenced():
            future = training.load_state_with_optimizer(path) if with_optimizer else training.load_state(path)
        future.result(timeout=RESULT_TIMEOUT_S)
        return training

    def close(self) -> None:
        self._session.close()

    # --- parameters the server ignores ------------------------------------------------------------

    def _configured_parameters(self) -> list[SentParameter]:
        """What rlctl sends with `create_model` and every `optim_step` (the SDK's defaults for the LoRA flags)."""
        lora = {"rank": self._config.lora_rank, "seed": self._config.seed}
        lora.update(train_mlp=True, train_attn=True, train_unembed=True)
        adam = {"learning_rate": self._config.learning_rate, "beta1": ADAM_BETA1, "beta2": ADAM_BETA2}
        adam.update(eps=ADAM_EPS, weight_decay=0.0, grad_clip_norm=0.0)
        return [
            SentParameter("/api/v1/create_model", ("lora_config",), name, value) for name, value in lora.items()
        ] + [SentParameter("/api/v1/optim_step", ("adam_params",), name, value) for name, value in adam.items()]

    def drain_warnings(self) -> list[BackendWarning]:
        return self._session.warnings.drain()

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
        return self._gradients(data, self._submit_forward_backward(data).result(timeout=RESULT_TIMEOUT_S))

    def optim_step(self, learning_rate: float) -> None:
        self._submit_optim_step(learning_rate).result(timeout=RESULT_TIMEOUT_S)

    def publish_weights(self, step: int) -> PublishedWeights:
        return self._use_sampler(self._submit_publish().result(timeout=RESULT_TIMEOUT_S), step)

    def train_step(self, data: Sequence[TrainingDatum], learning_rate: float, step: int) -> StepOutcome:
        """The step's three calls are sent before any result is awaited: the SDK sends a model's requests in the
        order they were made and the service runs them in that order, so the Adam step applies these gradients
        and the published weights are the stepped ones, while the round trips overlap."""
        started = time.perf_counter()
        gradients = self._submit_forward_backward(data)
        stepped = self._submit_optim_step(learning_rate)
        sampler = self._submit_publish()
        return timed_step(
            started,
            lambda: self._gradients(data, gradients.result(timeout=RESULT_TIMEOUT_S)),
            lambda: stepped.result(timeout=RESULT_TIMEOUT_S),
            lambda: self._use_sampler(sampler.result(timeout=RESULT_TIMEOUT_S), step),
        )

    def _submit_forward_backward(self, data: Sequence[TrainingDatum]):
        datums = [self._datum(datum, with_advantages=True) for datum in data]
        loss = self._config.loss
        return self._training.forward_backward(datums, loss.name, loss.tinker_config())

    def _gradients(self, data: Sequence[TrainingDatum], output: tinker.ForwardBackwardOutput) -> ForwardBackwardResult:
        logprobs = self._logprobs(output)
        loss_sum = output.metrics.get("loss:sum")
        if loss_sum is None:  # compute it as the service defines it
            loss_sum = self._config.loss.summed(data, logprobs)
        return ForwardBackwardResult(loss_sum=float(loss_sum), logprobs=logprobs)

    def _submit_optim_step(self, learning_rate: float):
        params = self._tinker.AdamParams(learning_rate=learning_rate, beta1=ADAM_BETA1, beta2=ADAM_BETA2, eps=ADAM_EPS)
        return self._training.optim_step(params)

    def _submit_publish(self):
        return self._training.save_weights_and_get_sampling_client()

    def _use_sampler(self, sampler: tinker.SamplingClient, step: int) -> PublishedWeights:
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
        return self._session.sample(sampler, request)


@contextlib.contextmanager
def _deprecation_notice_silenced() -> Iterator[None]:
    """The SDK warns and logs an error when `load_state*` is called; for a 0.25-protocol server it is the only way."""
    sdk_log = logging.getLogger("tinker.lib.public_interfaces.training_client")
    level = sdk_log.level
    sdk_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        sdk_log.setLevel(level)
