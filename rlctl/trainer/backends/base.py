"""The interface every training backend implements, and the sampling types the inference server uses."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.trainer.grpo import TrainingDatum

TopLogprobs = list[tuple[int, float]]


class SamplingRequestError(ValueError):
    """A sampling request the backend cannot serve as asked (empty prompt, longer than the context): the
    caller's fault, answered 400. Any other exception of `sample` is the backend's fault (docs/TRAINER.md)."""


@dataclass(frozen=True)
class SamplingRequest:
    prompt_tokens: list[int]
    n: int = 1
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs: int = 0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    logprobs: list[float]  # under the model itself (temperature 1), the same quantity the trainer computes
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    top_logprobs: list[TopLogprobs] | None = None
    matched_stop: str | int | None = None
    weights_version: int | None = None  # the published weights it was sampled from, when the backend knows


@dataclass(frozen=True)
class ForwardBackwardResult:
    loss_sum: float
    logprobs: list[list[float]]  # per datum, aligned with its target tokens
    # Sums over completion tokens where the backend measures them (local): entropy_sum over tokens, kl_sum over
    # kl_tokens (all of them with a KL penalty; without one the first micro-batch's, on one step in ten).
    token_stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepOutcome:
    """A training step's result, and how long each of its calls took to come back."""

    result: ForwardBackwardResult
    published: PublishedWeights
    forward_backward_s: float  # from the start of the step until the gradients' result came back
    optimizer_s: float  # then until the optimiser step's did
    publish_s: float  # then until the new weights were published


def timed_step(
    started: float,
    gradients: Callable[[], ForwardBackwardResult],
    stepped: Callable[[], object],
    published: Callable[[], PublishedWeights],
) -> StepOutcome:
    """Wait for a step's three results in order, timing each from `started` (the step's first call)."""
    result = gradients()
    gradients_done = time.perf_counter()
    stepped()
    optimizer_done = time.perf_counter()
    weights = published()
    return StepOutcome(
        result,
        weights,
        forward_backward_s=gradients_done - started,
        optimizer_s=optimizer_done - gradients_done,
        publish_s=time.perf_counter() - optimizer_done,
    )


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str  # local directory or tinker:// URI of the training state
    weights: str  # what a user loads for inference: local adapter directory or tinker:// sampler URI
    # False: the weights alone, a warm start from another run's checkpoint (its optimiser state is not this run's)
    optimizer: bool = True

    def as_record(self) -> dict[str, Any]:
        return {"step": self.step, "path": self.path, "weights": self.weights}


@dataclass(frozen=True)
class BackendWarning:
    """Something the run should know about the backend, e.g. a parameter the training server ignores."""

    code: str  # stable: parameter_ignored
    message: str
    parameter: str | None = None

    def as_record(self) -> dict[str, Any]:
        return {"code": self.code, "parameter": self.parameter, "message": self.message}


class WarningLog:
    """Warnings raised from any thread (training or sampling), each (code, parameter) once, drained by the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str | None]] = set()
        self._pending: list[BackendWarning] = []

    def add(self, warning: BackendWarning) -> None:
        with self._lock:
            key = (warning.code, warning.parameter)
            if key in self._seen:
                return
            self._seen.add(key)
            self._pending.append(warning)

    def drain(self) -> list[BackendWarning]:
        with self._lock:
            pending, self._pending = self._pending, []
        return pending


@dataclass(frozen=True)
class PublishedWeights:
    version: int = 0  # the training step the weights come from
    reference: str | None = None  # remote sampler handle, or None when published in-process


class TrainingBackend(ABC):
    """One trainable LoRA model: gradients, optimiser, published weights for sampling, checkpoints."""

    name: str
    model_name: str  # the id the inference server reports
    tokenizer: Any
    published: PublishedWeights = PublishedWeights()  # replaced, never mutated: readers see whole values

    @abstractmethod
    def compute_logprobs(self, data: Sequence[TrainingDatum]) -> list[list[float]]:
        """Logprobs of each datum's targets under the current weights (no gradients)."""

    @abstractmethod
    def forward_backward(self, data: Sequence[TrainingDatum]) -> ForwardBackwardResult:
        """Accumulate gradients of the importance-sampling loss -(exp(logp - sampler_logp) * adv).sum()."""

    @abstractmethod
    def optim_step(self, learning_rate: float) -> None:
        """Apply one Adam step (β1 0.9, β2 0.95, eps 1e-8) and clear the gradients."""

    def train_step(self, data: Sequence[TrainingDatum], learning_rate: float, step: int) -> StepOutcome:
        """One step's calls in order: gradients, Adam step, then the weights published as version `step`.

        Here each call waits for the one before. A remote backend overrides it to send all three before waiting
        for any (the service runs one model's requests in the order sent), as tinker-cookbook does."""
        return timed_step(
            time.perf_counter(),
            lambda: self.step_gradients(data, step),
            lambda: self.optim_step(learning_rate),
            lambda: self.publish_weights(step),
        )

    def step_gradients(self, data: Sequence[TrainingDatum], step: int) -> ForwardBackwardResult:
        """Step `step`'s `forward_backward` (a backend may measure some metrics on some steps only)."""
        return self.forward_backward(data)

    @abstractmethod
    def publish_weights(self, step: int) -> PublishedWeights:
        """Make the current weights the ones the inference server samples from."""

    @abstractmethod
    def save_checkpoint(self, step: int) -> Checkpoint:
        """Persist weights and optimiser state so a restarted trainer continues from `step`."""

    @abstractmethod
    def sample(self, request: SamplingRequest) -> list[Completion]:
        """`request.n` completions from the newest published weights."""

    def drain_warnings(self) -> list[BackendWarning]:
        """Warnings raised since the last call, for the run's state and metrics."""
        return []

    def discard_gradients(self) -> None:  # noqa: B027 - optional hook
        """Forget gradients a failed step may have accumulated, so the next step starts clean."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release remote sessions or other resources."""
