"""The local backend's sampler: continuously batched generation from its own copy of the published weights.

Two rules make sampling cheap on a small model, where a forward pass costs about the same for one row as for a
hundred (docs/TRAINER.md#local-sampling):

- **One batch that requests join and leave.** Every row of every request being sampled (a group's `n`
  completions, other groups, other models' requests) goes through one forward pass per token, with a KV cache.
  A request that arrives while the batch runs joins it before its next token: the prompts the batch has not
  read yet are read in one pass of their own, and its rows go beside the batch's. What the rows have read is
  the batch's `RowCache` (rlctl/trainer/backends/kv_caches.py): where the architecture allows, each distinct prompt's
  keys and values are held once for all its rows. A row leaves the batch when it ends, and a request is
  answered as soon as its last row has ended. Every forward pass runs on the sampler's one thread, started by
  the first request: torch's intra-op threads are a team per calling thread, and one warm team is much faster
  than a cold one per caller (each extra team also makes all of them sleep between operators).
- **Sampling does not wait on training.** The sampler has its own LoRA adapter over the training model's base
  weights (shared, never copied): `stage` hands it a copy of the newly published adapter, which it takes up
  when the batch has emptied. From then on no request joins the running batch, so it ends within one
  request's length; a request in flight finishes on the weights it started with, and each completion says
  which version it came from.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlctl.trainer.backends.base import Completion, SamplingRequest
from rlctl.trainer.backends.kv_caches import PaddedCache, RowCache, SharedPrefixCache, use_shared_prefix

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

    def wait(self) -> list[Completion]:
        """Blocks until answered: the completions, or the sampling's error raised here."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


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
    """The rows being decoded together. Invariants between steps: `kv` holds what every row has read, in the
    order of `rows`; `logits` ([rows, vocabulary]) is each row's next-token distribution, not yet sampled."""

    requests: dict[PendingSample, list[_Row]]  # each unanswered request's rows, in order
    rows: list[_Row]  # the rows being decoded, in the cache's order
    kv: RowCache
    logits: torch.Tensor
    version: int
    generator: torch.Generator | None  # a seeded request's own, for the batch it has alone

    @property
    def joinable(self) -> bool:
        return self.generator is None and self.kv.resizable


def sampler_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose frozen parameters (the base weights) are the very same tensors, and whose trainable
    ones (the adapter) are its own."""
    memo: dict[int, Any] = {id(parameter): parameter for parameter in model.parameters() if not parameter.requires_grad}
    clone = copy.deepcopy(model, memo)
    for parameter in clone.parameters():
        parameter.requires_grad_(False)
    return clone


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
        shared_prefix: bool = True,
        on_answered: Callable[[PendingSample], None] | None = None,
    ) -> None:
        """`shared_prefix`: hold each prompt once for all its rows where the architecture allows (off: every row
        holds its own copy, as for any other architecture). `on_answered`: called, on the sampling thread, with
        each request once it has its result or its error (the process sampler sends it back from there)."""
        self._model = sampler_copy(training_model)
        self._model.eval()
        self.shared_prefix = shared_prefix and use_shared_prefix(self._model)
        sampler_parameters = dict(self._model.named_parameters())
        trainable = [name for name, parameter in training_model.named_parameters() if parameter.requires_grad]
        self._targets = [sampler_parameters[name] for name in trainable]
        self._tokenizer = tokenizer
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._device = device
        self._default_generator = default_generator
        # Guards the queue, the thread's start and the closing; the thread sleeps on it while it has nothing to do.
        self._work = threading.Condition()
        self._queue: list[PendingSample] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._batch: _Batch | None = None  # the sampling thread's alone
        self._staged: tuple[int, list[torch.Tensor]] | None = None
        self._staged_lock = threading.Lock()
        self.version = 0  # the weights the sampler's adapter holds now
        self._on_answered = on_answered

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
        self.submit(pending)
        return pending.wait()

    def submit(self, pending: PendingSample) -> None:
        """Queues `pending` without waiting for it: its `done` is set once it has its result or its error."""
        with self._work:
            if self._closed:
                raise RuntimeError("the sampler is closed")
            self._queue.append(pending)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
                self._thread.start()
            self._work.notify()

    def close(self) -> None:
        """Ends the sampling thread; requests still waiting or being sampled fail."""
        with self._work:
            self._closed = True
            self._work.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while self._has_work():
            self._step()
        with self._work:
            waiting, self._queue = self._queue, []
        self._fail_batch(waiting, RuntimeError("the sampler was closed"))

    def _has_work(self) -> bool:
        """Waits until there is a request or a batch to sample; False once the sampler is closed."""
        with self._work:
            while not self._closed and not self._queue and self._batch is None:
                self._work.wait()
            return not self._closed

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
            self._fail_batch(joining, error)

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
        with self._work:
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
        """The joining requests' rows go after the batch's (or make a new batch); the cache reads the prompts it
        has not read yet, each distinct prompt once."""
        if self._batch is None:
            seed = joining[0].request.seed
            self._batch = _Batch(
                requests={},
                rows=[],
                kv=self._new_cache(),
                logits=torch.zeros(0),
                version=self.version,
                generator=torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None,
            )
        batch = self._batch
        requests = {pending: [_Row(pending) for _ in range(pending.request.n)] for pending in joining}
        rows = [row for request_rows in requests.values() for row in request_rows]
        logits = batch.kv.add_rows([tuple(row.pending.request.prompt_tokens) for row in rows])
        batch.logits = torch.cat([batch.logits, logits]) if batch.rows else logits
        batch.rows.extend(rows)
        batch.requests.update(requests)

    def _new_cache(self) -> RowCache:
        if self.shared_prefix:
            return SharedPrefixCache(self._model, self._device)
        return PaddedCache(self._model, self._pad_id, self._device)

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
        if batch.kv.resizable and len(going_on) < len(batch.rows):
            batch.kv.keep_rows(going_on)
            batch.rows = [batch.rows[index] for index in going_on]
            chosen = chosen[going_on]
        batch.logits = batch.kv.decode(chosen)

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
        for pending in answered:
            pending.done.set()
            if self._on_answered is not None:
                self._on_answered(pending)

    def _fail_batch(self, others: Sequence[PendingSample], error: BaseException) -> None:
        """The batch is dropped; its requests and `others` get `error`."""
        failed = [*others, *(self._batch.requests if self._batch is not None else ())]
        self._batch = None
        for pending in failed:
            pending.error = error
        self._answered(failed)


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
