"""The local backend's sampler: batched generation from its own copy of the published weights.

Two rules make sampling cheap on a small model, where a forward pass costs about the same for one row as for a
hundred (docs/TRAINER.md#local-sampling):

- **One batch for every waiting request.** Requests that arrive while a batch runs wait for it and then go
  together as the next batch: every row of every request (a group's `n` completions, other groups, other
  models' requests) in one forward pass per token, prompts left-padded, with a KV cache. The first waiting
  caller runs the batch; the others wait for their results (no thread of its own to start or stop).
- **Sampling does not wait on training.** The sampler has its own LoRA adapter over the training model's base
  weights (shared, never copied): `stage` hands it a copy of the newly published adapter, which it takes up
  before its next batch. A training step and a batch of samples run at the same time; a batch in flight when
  weights are published finishes on the weights it started with, and each completion says which version it
  came from.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainer.backends.base import Completion, SamplingRequest

# Rows (completions) in one batch: bounds the KV cache; a request never splits across batches.
MAX_BATCH_ROWS = 256


@dataclass
class PendingSample:
    """One request waiting for its batch, with what the backend resolved for it (room left, stop ids)."""

    request: SamplingRequest
    max_new_tokens: int
    stop_ids: frozenset[int]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[Completion] | None = None
    error: BaseException | None = None


def sampler_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose frozen parameters (the base weights) are the very same tensors, and whose trainable
    ones (the adapter) are its own."""
    memo: dict[int, Any] = {id(parameter): parameter for parameter in model.parameters() if not parameter.requires_grad}
    clone = copy.deepcopy(model, memo)
    for parameter in clone.parameters():
        parameter.requires_grad_(False)
    return clone


class BatchedSampler:
    def __init__(
        self,
        training_model: nn.Module,
        tokenizer: Any,
        device: torch.device,
        default_generator: torch.Generator,
    ) -> None:
        self._model = sampler_copy(training_model)
        self._model.eval()
        sampler_parameters = dict(self._model.named_parameters())
        self._names = [name for name, parameter in training_model.named_parameters() if parameter.requires_grad]
        self._targets = [sampler_parameters[name] for name in self._names]
        self._tokenizer = tokenizer
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._device = device
        self._default_generator = default_generator
        self._queue: list[PendingSample] = []
        self._queue_lock = threading.Lock()
        self._run_lock = threading.Lock()  # one batch at a time
        self._staged: tuple[int, list[torch.Tensor]] | None = None
        self._staged_lock = threading.Lock()
        self.version = 0  # the weights the sampler's adapter holds now

    def stage(self, version: int, trainable: Sequence[torch.Tensor]) -> None:
        """The adapter of weights `version` (the training model's trainable tensors, in `named_parameters`
        order), copied now, taken up before the next batch."""
        with torch.no_grad():
            snapshot = [tensor.detach().clone() for tensor in trainable]
        with self._staged_lock:
            self._staged = (version, snapshot)

    def _take_up_staged(self) -> None:
        with self._staged_lock:
            staged, self._staged = self._staged, None
        if staged is None:
            return
        version, tensors = staged
        with torch.no_grad():
            for target, tensor in zip(self._targets, tensors, strict=True):
                target.copy_(tensor)
        self.version = version

    def sample(self, pending: PendingSample) -> list[Completion]:
        with self._queue_lock:
            self._queue.append(pending)
        while not pending.done.is_set():
            with self._run_lock:
                if pending.done.is_set():
                    break
                batch = self._next_batch()
                if batch:
                    self._run(batch)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _next_batch(self) -> list[PendingSample]:
        """The oldest waiting requests, up to MAX_BATCH_ROWS rows. A seeded request goes alone, so its samples
        depend on its seed and prompt only, never on what else was waiting."""
        with self._queue_lock:
            if not self._queue:
                return []
            if self._queue[0].request.seed is not None:
                return [self._queue.pop(0)]
            batch: list[PendingSample] = []
            rows = 0
            for pending in list(self._queue):
                if pending.request.seed is not None:
                    continue
                if batch and rows + pending.request.n > MAX_BATCH_ROWS:
                    break
                batch.append(pending)
                rows += pending.request.n
            for pending in batch:
                self._queue.remove(pending)
            return batch

    def _run(self, batch: list[PendingSample]) -> None:
        try:
            self._take_up_staged()
            with torch.inference_mode():
                results = self._generate(batch)
            for pending, completions in zip(batch, results, strict=True):
                pending.result = completions
        except BaseException as error:  # noqa: BLE001 - every caller of the batch gets the failure
            for pending in batch:
                pending.error = error
        finally:
            for pending in batch:
                pending.done.set()

    def _generate(self, batch: list[PendingSample]) -> list[list[Completion]]:
        """Every row of every request, left-padded to the longest prompt, one forward pass per new token."""
        device = self._device
        owners: list[int] = []  # the request of each row
        for index, pending in enumerate(batch):
            owners.extend([index] * pending.request.n)
        rows = len(owners)
        width = max(len(pending.request.prompt_tokens) for pending in batch)
        input_ids = torch.full((rows, width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((rows, width), dtype=torch.long)
        for row, owner in enumerate(owners):
            prompt = batch[owner].request.prompt_tokens
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        slices: list[slice] = []
        start = 0
        for pending in batch:
            slices.append(slice(start, start + pending.request.n))
            start += pending.request.n
        generators = [
            torch.Generator(device="cpu").manual_seed(p.request.seed) if p.request.seed is not None else None
            for p in batch
        ]

        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        top: list[list[list[tuple[int, float]]]] = [[] for _ in range(rows)]
        finish: list[str | None] = [None] * rows
        matched: list[str | int | None] = [None] * rows
        longest = max(pending.max_new_tokens for pending in batch)
        output = self._model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        for step in range(longest):
            step_logits = output.logits[:, -1, :].float()
            step_logprobs = torch.log_softmax(step_logits, dim=-1)
            chosen = torch.empty(rows, dtype=torch.long, device=device)
            for index, pending in enumerate(batch):
                part = slices[index]
                generator = generators[index] or self._default_generator
                chosen[part] = choose_tokens(step_logits[part], pending.request, generator)
            chosen_ids = chosen.tolist()
            chosen_logprobs = step_logprobs.gather(1, chosen[:, None]).squeeze(1).tolist()
            top_ids = top_values = None
            wants_top = max(pending.request.top_logprobs for pending in batch)
            if wants_top > 0:
                values, ids = step_logprobs.topk(min(wants_top, step_logprobs.shape[-1]), dim=-1)
                top_ids, top_values = ids.tolist(), values.tolist()
            for row, owner in enumerate(owners):
                if finish[row] is not None:
                    continue
                pending = batch[owner]
                request = pending.request
                token = chosen_ids[row]
                tokens[row].append(token)
                logprobs[row].append(chosen_logprobs[row])
                if request.top_logprobs > 0 and top_ids is not None and top_values is not None:
                    k = request.top_logprobs
                    top[row].append(list(zip(top_ids[row][:k], top_values[row][:k], strict=True)))
                if token in pending.stop_ids:
                    finish[row], matched[row] = "stop", token
                elif request.stop:
                    text = self._tokenizer.decode(tokens[row], skip_special_tokens=True)
                    hit = next((s for s in request.stop if s and s in text), None)
                    if hit is not None:
                        finish[row], matched[row] = "stop", hit
                if finish[row] is None and len(tokens[row]) >= pending.max_new_tokens:
                    finish[row] = "length"
            if all(reason is not None for reason in finish) or step == longest - 1:
                break
            attention = torch.cat([attention, torch.ones((rows, 1), dtype=torch.long, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            output = self._model(
                input_ids=chosen[:, None],
                attention_mask=attention,
                position_ids=positions,
                cache=output.cache,
                use_cache=True,
            )
        version = self.version
        return [
            [
                Completion(
                    tokens=tokens[row],
                    logprobs=logprobs[row],
                    finish_reason=finish[row] or "length",
                    top_logprobs=top[row] if pending.request.top_logprobs > 0 else None,
                    matched_stop=matched[row],
                    weights_version=version,
                )
                for row in range(slices[index].start, slices[index].stop)
            ]
            for index, pending in enumerate(batch)
        ]


def choose_tokens(logits: torch.Tensor, request: SamplingRequest, generator: torch.Generator) -> torch.Tensor:
    if request.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > request.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)
