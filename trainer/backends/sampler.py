"""The local backend's sampler: continuously batched generation from its own copy of the published weights.

Two rules make sampling cheap on a small model, where a forward pass costs about the same for one row as for a
hundred (docs/TRAINER.md#local-sampling):

- **One batch that requests join and leave.** Every row of every request being sampled (a group's `n`
  completions, other groups, other models' requests) goes through one forward pass per token, with a KV cache.
  A request that arrives while the batch runs joins it before its next token: its prompts are read in one pass
  of their own, left-padded, and their cache is put beside the batch's (the shorter side padded on the left).
  A row leaves the batch when it ends, and a request is answered as soon as its last row has ended. The callers
  take turns running the batch: one runs it until its own request is answered, then another waiting caller
  goes on (no thread of its own to start or stop).
- **Sampling does not wait on training.** The sampler has its own LoRA adapter over the training model's base
  weights (shared, never copied): `stage` hands it a copy of the newly published adapter, which it takes up
  when the batch has emptied. From then on no request joins the running batch, so it ends within one
  request's length; a request in flight finishes on the weights it started with, and each completion says
  which version it came from.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from transformers.cache_utils import DynamicLayer

from trainer.backends.base import Completion, SamplingRequest

# Rows (completions) in one batch: bounds the KV cache; a request never splits across batches.
MAX_BATCH_ROWS = 256


@dataclass(eq=False)  # each is itself: a key of its batch's requests
class PendingSample:
    """One request waiting for its batch, with what the backend resolved for it (room left, stop ids)."""

    request: SamplingRequest
    max_new_tokens: int
    stop_ids: frozenset[int]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[Completion] | None = None
    error: BaseException | None = None


@dataclass
class _Row:
    """One completion being sampled."""

    pending: PendingSample
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    matched: str | int | None = None

    def completion(self, version: int) -> Completion:
        request = self.pending.request
        return Completion(
            tokens=self.tokens,
            logprobs=self.logprobs,
            finish_reason=self.finish or "length",
            top_logprobs=self.top if request.top_logprobs > 0 else None,
            matched_stop=self.matched,
            weights_version=version,
        )


@dataclass
class _Batch:
    """The rows being decoded together. Invariants between steps: `cache` and `attention` ([rows, length]) cover
    every token fed so far, left-padded; `positions` ([rows, 1]) is each row's last position; `logits`
    ([rows, vocabulary]) is each row's next-token distribution, not yet sampled."""

    requests: dict[PendingSample, list[_Row]]  # each unanswered request's rows, in order
    rows: list[_Row]  # the rows being decoded, in the cache's order
    cache: Any
    attention: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    version: int
    generator: torch.Generator | None  # a seeded request's own, for the batch it has alone

    @property
    def resizable(self) -> bool:
        """Rows can join and leave; otherwise ended rows stay until every row has ended."""
        return _resizable(self.cache)

    @property
    def joinable(self) -> bool:
        return self.generator is None and self.resizable


def sampler_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose frozen parameters (the base weights) are the very same tensors, and whose trainable
    ones (the adapter) are its own."""
    memo: dict[int, Any] = {id(parameter): parameter for parameter in model.parameters() if not parameter.requires_grad}
    clone = copy.deepcopy(model, memo)
    for parameter in clone.parameters():
        parameter.requires_grad_(False)
    return clone


def _resizable(cache: Any) -> bool:
    """Rows can be added to and dropped from a cache of plain growing layers (keys and values [rows, heads,
    length, dim]); any other kind (sliding windows, quantised, static) keeps its batch as it began."""
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` padded with zeros at the front of dimension `dim` to `width`."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    return functional.pad(tensor, [0, 0] * (tensor.dim() - 1 - dim) + [missing, 0])


def _alike(first: PendingSample, second: PendingSample) -> bool:
    """Rows of the two requests are drawn in one call: the same request, or two without a seed (both on the
    default generator) with the same temperature and top-p."""
    a, b = first.request, second.request
    return first is second or (
        a.seed is None and b.seed is None and a.temperature == b.temperature and a.top_p == b.top_p
    )


def _runs(rows: Sequence[_Row]) -> Iterator[tuple[int, int, SamplingRequest]]:
    """(start, stop, request) of each run of consecutive rows drawn alike."""
    start = 0
    for index in range(1, len(rows) + 1):
        if index == len(rows) or not _alike(rows[start].pending, rows[index].pending):
            yield start, index, rows[start].pending.request
            start = index


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
        # Guards the queue and whose turn it is to run the batch; waiting callers sleep on it, woken by answers.
        self._turns = threading.Condition()
        self._queue: list[PendingSample] = []
        self._running = False
        self._batch: _Batch | None = None  # only the caller whose turn it is touches it
        self._staged: tuple[int, list[torch.Tensor]] | None = None
        self._staged_lock = threading.Lock()
        self.version = 0  # the weights the sampler's adapter holds now

    def stage(self, version: int, trainable: Sequence[torch.Tensor]) -> None:
        """The adapter of weights `version` (the training model's trainable tensors, in `named_parameters`
        order), copied now, taken up once the running batch has emptied."""
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
        with self._turns:
            self._queue.append(pending)
            while self._running and not pending.done.is_set():
                self._turns.wait()
            my_turn = not pending.done.is_set()
            self._running = self._running or my_turn
        if my_turn:
            try:
                while not pending.done.is_set():
                    self._step()
            finally:
                with self._turns:
                    self._running = False
                    self._turns.notify_all()  # a caller still waiting runs the batch on
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _step(self) -> None:
        """Let waiting requests join the batch (or start one), then sample one token for each of its rows."""
        joining: list[PendingSample] = []
        try:
            with torch.inference_mode():
                joining = self._take_joining()
                if joining:
                    self._join(joining)
                    joining = []
                if self._batch is not None:
                    self._decode()
        except BaseException as error:  # noqa: BLE001 - every request of the batch gets the failure
            failed = [*joining, *(self._batch.requests if self._batch is not None else ())]
            self._batch = None
            for pending in failed:
                pending.error = error
            self._answered(failed)

    def _take_joining(self) -> list[PendingSample]:
        """The oldest waiting requests, in order, up to MAX_BATCH_ROWS rows (the first of a new batch whatever
        its size). A new batch takes up staged weights first, and no request joins a batch once new weights are
        staged. A seeded request has a batch of its own, so that its samples depend on its seed and prompt
        only, never on what else is sampled."""
        batch = self._batch
        if batch is None:
            self._take_up_staged()
        elif not batch.joinable or self._staged is not None:
            return []
        rows = len(batch.rows) if batch is not None else 0
        taken: list[PendingSample] = []
        with self._turns:
            for pending in self._queue:
                if pending.request.seed is not None:
                    if batch is None and not taken:
                        taken.append(pending)
                    break
                if (taken or batch is not None) and rows + pending.request.n > MAX_BATCH_ROWS:
                    break
                taken.append(pending)
                rows += pending.request.n
            del self._queue[: len(taken)]
        return taken

    def _join(self, joining: list[PendingSample]) -> None:
        """The joining requests' prompts in one forward pass of their own; their rows then go beside the
        batch's, the shorter side's cache and attention mask padded on the left."""
        new = self._prefill(joining)
        batch = self._batch
        if batch is None:
            self._batch = new
            return
        width = max(batch.attention.shape[1], new.attention.shape[1])
        for layer, added in zip(batch.cache.layers, new.cache.layers, strict=True):
            layer.keys = torch.cat([_left_pad(layer.keys, width, 2), _left_pad(added.keys, width, 2)])
            layer.values = torch.cat([_left_pad(layer.values, width, 2), _left_pad(added.values, width, 2)])
        batch.attention = torch.cat([_left_pad(batch.attention, width, 1), _left_pad(new.attention, width, 1)])
        batch.positions = torch.cat([batch.positions, new.positions])
        batch.logits = torch.cat([batch.logits, new.logits])
        batch.rows.extend(new.rows)
        batch.requests.update(new.requests)

    def _prefill(self, joining: list[PendingSample]) -> _Batch:
        """The joining requests' rows, ready to decode: each distinct prompt is read once (a group's `n` rows, and
        the requests of one group, share theirs), its cache then copied for each of its rows."""
        requests = {pending: [_Row(pending) for _ in range(pending.request.n)] for pending in joining}
        rows = [row for request_rows in requests.values() for row in request_rows]
        distinct: dict[tuple[int, ...], int] = {}
        sources = [distinct.setdefault(tuple(row.pending.request.prompt_tokens), len(distinct)) for row in rows]
        output, attention, positions = self._read_prompts(list(distinct))
        if len(distinct) < len(rows):
            if _resizable(output.cache):
                index = torch.tensor(sources, device=attention.device)
                output.cache.batch_select_indices(index)
                output.logits, attention, positions = output.logits[index], attention[index], positions[index]
            else:  # a cache whose rows cannot be copied: every row reads its prompt
                output, attention, positions = self._read_prompts([row.pending.request.prompt_tokens for row in rows])
        seed = joining[0].request.seed
        return _Batch(
            requests=requests,
            rows=rows,
            cache=output.cache,
            attention=attention,
            positions=positions[:, -1:],
            logits=output.logits[:, -1, :].float(),
            version=self.version,
            generator=torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None,
        )

    def _read_prompts(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """One forward pass over the prompts, left-padded: the model's output (the last position's logits and the
        cache), the attention mask and the position ids."""
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for index, prompt in enumerate(prompts):
            input_ids[index, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[index, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(self._device), attention.to(self._device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        output = self._model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        return output, attention, positions

    def _decode(self) -> None:
        """Sample each row's next token, answer the requests whose rows have all ended, and feed the next tokens
        of the rows that go on through the model."""
        batch = self._batch
        assert batch is not None
        logprobs = torch.log_softmax(batch.logits, dim=-1)
        chosen = self._choose(batch)
        chosen_ids = chosen.tolist()
        chosen_logprobs = logprobs.gather(1, chosen[:, None]).squeeze(1).tolist()
        top: tuple[list[list[int]], list[list[float]]] | None = None
        wants_top = max(pending.request.top_logprobs for pending in batch.requests)
        if wants_top > 0:
            values, ids = logprobs.topk(min(wants_top, logprobs.shape[-1]), dim=-1)
            top = ids.tolist(), values.tolist()
        for index, row in enumerate(batch.rows):
            if row.finish is None:
                self._extend(row, chosen_ids[index], chosen_logprobs[index], top, index)
        self._answer_ended(batch)
        going_on = [index for index, row in enumerate(batch.rows) if row.finish is None]
        if not going_on:
            self._batch = None
            return
        if batch.resizable and len(going_on) < len(batch.rows):
            self._keep_rows(batch, going_on)
            chosen = chosen[going_on]
        batch.attention = torch.cat([batch.attention, batch.attention.new_ones((len(batch.rows), 1))], dim=1)
        batch.positions = batch.positions + 1
        output = self._model(
            input_ids=chosen[:, None],
            attention_mask=batch.attention,
            position_ids=batch.positions,
            cache=batch.cache,
            use_cache=True,
        )
        batch.cache = output.cache
        batch.logits = output.logits[:, -1, :].float()

    def _choose(self, batch: _Batch) -> torch.Tensor:
        chosen = torch.empty(len(batch.rows), dtype=torch.long, device=batch.logits.device)
        generator = batch.generator or self._default_generator
        for start, stop, request in _runs(batch.rows):
            chosen[start:stop] = choose_tokens(batch.logits[start:stop], request, generator)
        return chosen

    def _extend(
        self,
        row: _Row,
        token: int,
        logprob: float,
        top: tuple[list[list[int]], list[list[float]]] | None,
        index: int,
    ) -> None:
        pending, request = row.pending, row.pending.request
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if request.top_logprobs > 0 and top is not None:
            k = request.top_logprobs
            row.top.append(list(zip(top[0][index][:k], top[1][index][:k], strict=True)))
        if token in pending.stop_ids:
            row.finish, row.matched = "stop", token
        elif request.stop:
            text = self._tokenizer.decode(row.tokens, skip_special_tokens=True)
            hit = next((s for s in request.stop if s and s in text), None)
            if hit is not None:
                row.finish, row.matched = "stop", hit
        if row.finish is None and len(row.tokens) >= pending.max_new_tokens:
            row.finish = "length"

    def _answer_ended(self, batch: _Batch) -> None:
        """Answer each request whose rows have all ended, now, whatever else the batch still samples."""
        ended = [pending for pending, rows in batch.requests.items() if all(row.finish for row in rows)]
        for pending in ended:
            pending.result = [row.completion(batch.version) for row in batch.requests.pop(pending)]
        self._answered(ended)

    def _answered(self, answered: Sequence[PendingSample]) -> None:
        if not answered:
            return
        with self._turns:
            for pending in answered:
                pending.done.set()
            self._turns.notify_all()

    @staticmethod
    def _keep_rows(batch: _Batch, going_on: list[int]) -> None:
        """Keep only the rows `going_on`, then drop the leading columns that are padding in all of them."""
        keep = torch.tensor(going_on, device=batch.attention.device)
        attention = batch.attention[keep]
        padding = int((attention.shape[1] - attention.sum(dim=1)).min())
        batch.rows = [batch.rows[index] for index in going_on]
        batch.attention = attention[:, padding:]
        batch.positions = batch.positions[keep]
        batch.cache.batch_select_indices(keep)
        for layer in batch.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, padding:], layer.values[:, :, padding:]


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
