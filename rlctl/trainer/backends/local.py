"""The `local` backend: torch + peft LoRA on this machine (CPU or CUDA).

The model lives in the trainer process and is shared with the inference server: the sampler
(`rlctl.trainer.backends.sampler`) keeps its own LoRA adapter over the same base weights, so publishing after a step
hands it a copy of the adapter, never a reload, and sampling runs while the next step trains.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from rlctl.trainer.backends.base import (
    Checkpoint,
    Completion,
    ForwardBackwardResult,
    PublishedWeights,
    SamplingRequest,
    SamplingRequestError,
    TrainingBackend,
)
from rlctl.trainer.backends.sampler import BatchedSampler, PendingSample
from rlctl.trainer.backends.sampler_process import ProcessSampler, use_process_sampler
from rlctl.trainer.config import TrainerConfig
from rlctl.trainer.defaults import ADAM_BETA1, ADAM_BETA2, ADAM_EPS
from rlctl.trainer.grpo import TrainingDatum
from rlctl.trainer.tiny_model import default_tiny_model_dir, init_tiny_model

if TYPE_CHECKING:
    from peft import LoraModel

log = logging.getLogger(__name__)

ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
# Tokens per forward/backward micro-batch: bounds activation memory on real models.
MICROBATCH_TOKENS = 16384
# Without a KL penalty, KL to the reference is a metric only, measured on the first micro-batch of every tenth step
# (steps 1, 11, 21, ...: TRL's logging interval): its reference pass, a forward of the batch with the adapter off,
# is a third of a step (`benchmarks/train_step_limit.py`), and the metric moves slowly.
KL_METRIC_EVERY = 10


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_base_model(config: TrainerConfig) -> str:
    """The configured model directory or cached hub id; the tiny model in the data directory by default."""
    if config.base_model:
        return config.base_model
    return str(init_tiny_model(default_tiny_model_dir(config.data_dir), seed=config.seed))


def linear_module_names(model: nn.Module) -> list[str]:
    """Every linear layer kind: attention, MLP and the unembedding, as Tinker's LoRA trains by default."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)})


def _pad(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([list(row) + [value] * (width - len(row)) for row in rows], dtype=dtype, device=device)


def _logprobs_of(distribution: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The targets' logprobs from `distribution`, the log-softmax of the logits (training takes the policy's entropy
    from the same one)."""
    return distribution.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _completion_entropy_sum(distribution: torch.Tensor, completion: torch.Tensor) -> float:
    """The policy's entropy over the whole vocabulary (`distribution`: log-softmax of the logits), summed over the
    completion tokens only: the prompt's positions would triple its cost and are never reported."""
    with torch.no_grad():
        logprobs = distribution.detach()[completion.bool()]
        return float(-(logprobs.exp() * logprobs).sum())


def _microbatches(data: Sequence[TrainingDatum]) -> list[list[int]]:
    """Datum indices grouped so each group's padded size stays under MICROBATCH_TOKENS."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(range(len(data)), key=lambda i: len(data[i].input_tokens)):
        length = len(data[index].input_tokens)
        if current and max(longest, length) * (len(current) + 1) > MICROBATCH_TOKENS:
            groups.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        groups.append(current)
    return groups


def warm_up() -> None:
    """What every local backend's start does alike, done once where its processes are forked from (the fork
    server's preload, rlctl/supervisor/forkserver.py): transformers builds its table of checkpoint conversions at the
    first model load, compiling about a thousand regular expressions, half of a trainer's start-up CPU."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    get_checkpoint_conversion_mapping(None)


class LocalBackend(TrainingBackend):
    name = "local"

    def __init__(
        self, config: TrainerConfig, resume_from: Checkpoint | None = None, shared_prefix: bool = True
    ) -> None:
        """`shared_prefix`: the sampler holds each prompt once where the architecture allows (off: a copy per row,
        as for every other architecture; docs/TRAINER.md#local-sampling)."""
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(config.seed)
        self._config = config
        self._device = resolve_device(config.device)
        base_model = resolve_base_model(config)
        self.model_name = base_model
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_name or base_model)
        dtype = torch.bfloat16 if self._device.type == "cuda" else torch.float32
        base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
        base.to(self._device)  # type: ignore[arg-type]  # transformers' wrapped .to() hides self
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.effective_lora_alpha,
            target_modules=linear_module_names(base),
            lora_dropout=0.0,
            bias="none",
        )
        self.model = get_peft_model(base, lora)
        self.model.eval()  # no dropout anywhere: training and sampling see the same function
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        self._optimizer = torch.optim.AdamW(
            self._trainable,
            lr=config.learning_rate,
            betas=(ADAM_BETA1, ADAM_BETA2),
            eps=ADAM_EPS,
            weight_decay=0.0,
        )
        # Training calls (and checkpoints) one at a time; sampling never takes this lock.
        self._lock = threading.Lock()
        self._max_context = int(getattr(base.config, "max_position_embeddings", 4096))
        self.stop_token_ids = frozenset(self._stop_token_ids(base))  # a completion not ending in one was truncated
        self._sample_generator = torch.Generator(device="cpu").manual_seed(config.seed)
        if resume_from is not None:
            self._load_checkpoint(Path(resume_from.path), resume_from.optimizer)
        # Last: a process sampler forks here, with the model built (docs/TRAINER.md#local-sampling).
        sampler = ProcessSampler if use_process_sampler(config.sampler, self._device) else BatchedSampler
        self._sampler: BatchedSampler | ProcessSampler = sampler(
            self.model, self.tokenizer, self._device, self._sample_generator, shared_prefix=shared_prefix
        )

    def _stop_token_ids(self, model: nn.Module) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids.update(configured if isinstance(configured, list) else [configured])
        return {i for i in ids if i is not None}

    # --- training -------------------------------------------------------------------------------

    def _forward(self, data: Sequence[TrainingDatum], indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, V], mask [B, T]) of the datums at `indices`."""
        pad_id = self.tokenizer.pad_token_id or 0
        inputs = _pad([data[i].input_tokens for i in indices], pad_id, torch.long, self._device)
        mask = _pad([[1.0] * len(data[i].target_tokens) for i in indices], 0.0, torch.float32, self._device)
        return self.model(input_ids=inputs, attention_mask=mask.long()).logits.float(), mask

    def _targets(self, data: Sequence[TrainingDatum], indices: list[int]) -> torch.Tensor:
        return _pad(
            [data[i].target_tokens for i in indices], self.tokenizer.pad_token_id or 0, torch.long, self._device
        )

    def _target_logprobs(self, data: Sequence[TrainingDatum], indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs [B, T], mask [B, T]) of the targets of the datums at `indices`."""
        logits, mask = self._forward(data, indices)
        return _logprobs_of(torch.log_softmax(logits, dim=-1), self._targets(data, indices)), mask

    def _reference_logprobs(self, data: Sequence[TrainingDatum], indices: list[int]) -> torch.Tensor:
        """The targets' logprobs under the base model: the adapter off, so no second model is held. The adapter
        layers are switched directly: peft's `disable_adapter()` first inspects every layer's status, a millisecond
        or more on each pass. The sampler's adapter is its own copy, untouched."""
        adapters = cast("LoraModel", self.model.base_model)  # get_peft_model with a LoraConfig
        adapters.disable_adapter_layers()
        try:
            with torch.no_grad():
                return self._target_logprobs(data, indices)[0]
        finally:
            adapters.enable_adapter_layers()

    def compute_logprobs(self, data: Sequence[TrainingDatum]) -> list[list[float]]:
        result: list[list[float]] = [[] for _ in data]
        with self._lock, torch.no_grad():
            for indices in _microbatches(data):
                logprobs, _ = self._target_logprobs(data, indices)
                for row, index in enumerate(indices):
                    result[index] = logprobs[row, : len(data[index].target_tokens)].tolist()
        return result

    def step_gradients(self, data: Sequence[TrainingDatum], step: int) -> ForwardBackwardResult:
        return self.forward_backward(data, reference_metric=(step - 1) % KL_METRIC_EVERY == 0)

    def forward_backward(
        self, data: Sequence[TrainingDatum], *, reference_metric: bool = True
    ) -> ForwardBackwardResult:
        """`reference_metric`: without a KL penalty, measure `kl/reference` on the first micro-batch (a step
        measures it every KL_METRIC_EVERY steps); with one, KL is measured on every micro-batch regardless."""
        result: list[list[float]] = [[] for _ in data]
        loss_sum = 0.0
        stats = {"entropy_sum": 0.0, "kl_sum": 0.0, "kl_tokens": 0.0, "tokens": 0.0}
        with self._lock:
            for number, indices in enumerate(_microbatches(data)):
                measure_kl = self._config.kl_coef > 0 or (reference_metric and number == 0)
                logits, mask = self._forward(data, indices)
                distribution = torch.log_softmax(logits, dim=-1)  # once, for the logprobs and the entropy
                logprobs = _logprobs_of(distribution, self._targets(data, indices))
                sampler = _pad([data[i].sampler_logprobs or [] for i in indices], 0.0, torch.float32, self._device)
                advantages = _pad([data[i].advantages for i in indices], 0.0, torch.float32, self._device)
                completion = _pad([data[i].completion_mask for i in indices], 0.0, torch.float32, self._device)
                completion_tokens = float(completion.sum())  # one device sync, for both counts below
                objective = self._objective(logprobs, sampler, advantages, completion)
                loss = -(objective * mask).sum()
                if measure_kl:
                    # k3 estimate of KL(policy || reference) per token: non-negative, unbiased (Schulman)
                    log_ratio = self._reference_logprobs(data, indices) - logprobs
                    kl = torch.exp(log_ratio) - log_ratio - 1
                    if self._config.kl_coef > 0:
                        loss = loss + self._config.kl_coef * (kl * completion).sum()
                    stats["kl_sum"] += float((kl.detach() * completion).sum())
                    stats["kl_tokens"] += completion_tokens
                loss.backward()
                loss_sum += float(loss.detach())
                stats["entropy_sum"] += _completion_entropy_sum(distribution, completion)
                stats["tokens"] += completion_tokens
                detached = logprobs.detach()
                for row, index in enumerate(indices):
                    result[index] = detached[row, : len(data[index].target_tokens)].tolist()
        return ForwardBackwardResult(loss_sum=loss_sum, logprobs=result, token_stats=stats)

    def _objective(
        self, logprobs: torch.Tensor, sampler: torch.Tensor, advantages: torch.Tensor, completion: torch.Tensor
    ) -> torch.Tensor:
        """Per-token objective of the configured loss (rlctl.trainer.grpo.PolicyLoss gives the same per datum)."""
        loss = self._config.loss
        if loss.name == "cross_entropy":  # supervised: the logprob itself, weighted by the advantage
            return logprobs * advantages
        if loss.name == "gspo":  # one ratio per sequence: the geometric mean of its completion tokens' ratios
            tokens = completion.sum(dim=1, keepdim=True).clamp(min=1.0)
            ratio = torch.exp(((logprobs - sampler) * completion).sum(dim=1, keepdim=True) / tokens)
        else:
            ratio = torch.exp(logprobs - sampler)
        if loss.name == "importance_sampling":
            return ratio * advantages
        return torch.minimum(ratio * advantages, ratio.clamp(loss.clip_low, loss.clip_high) * advantages)

    def optim_step(self, learning_rate: float) -> None:
        with self._lock:
            for group in self._optimizer.param_groups:
                group["lr"] = learning_rate
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)

    def discard_gradients(self) -> None:
        with self._lock:
            self._optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        self._sampler.close()

    def publish_weights(self, step: int) -> PublishedWeights:
        # A copy of the adapter for the sampler, which takes it up before its next batch; the base is shared.
        with self._lock:
            self._sampler.stage(step, self._trainable)
            self.published = PublishedWeights(version=step, reference=None)
        return self.published

    # --- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, step: int) -> Checkpoint:
        directory = self._config.checkpoints_dir / f"step_{step}"
        staging = directory.with_name(f".{directory.name}.tmp")
        staging.mkdir(parents=True, exist_ok=True)
        with self._lock:
            # The base lm_head never changes; only the adapters (LoRA on lm_head included) need saving.
            self.model.save_pretrained(str(staging), save_embedding_layers=False)
            torch.save(self._optimizer.state_dict(), staging / OPTIMIZER_FILE)
        (staging / "trainer_checkpoint.json").write_text(json.dumps({"step": step, "base_model": self.model_name}))
        if directory.exists():
            import shutil

            shutil.rmtree(directory)
        staging.rename(directory)
        return Checkpoint(step=step, path=str(directory), weights=str(directory))

    def _load_checkpoint(self, directory: Path, with_optimizer: bool = True) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(self.model, load_file(directory / ADAPTER_FILE, device=str(self._device)))
        if with_optimizer:
            optimizer_state = torch.load(directory / OPTIMIZER_FILE, map_location=self._device, weights_only=True)
            self._optimizer.load_state_dict(optimizer_state)
        log.info("%s local backend from %s", "resumed" if with_optimizer else "warm-started", directory)

    # --- sampling -------------------------------------------------------------------------------

    def sample(self, request: SamplingRequest) -> list[Completion]:
        if not request.prompt_tokens:
            raise SamplingRequestError("the prompt is empty")
        room = self._max_context - len(request.prompt_tokens)
        if room <= 0:
            raise SamplingRequestError(
                f"the prompt has {len(request.prompt_tokens)} tokens; the context is {self._max_context}"
            )
        pending = PendingSample(
            request,
            max_new_tokens=min(request.max_new_tokens, room),
            stop_ids=self.stop_token_ids.union(request.stop_token_ids),
        )
        return self._sampler.sample(pending)
