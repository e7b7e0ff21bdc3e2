"""The sampler's key/value caches: what the rows of a batch have read, and each row's next-token logits.

Two kinds behind one interface (`RowCache`), chosen once per sampler (docs/TRAINER.md#local-sampling):

- `SharedPrefixCache` holds each distinct prompt's keys and values once, however many rows sample from it (a
  group's `n` completions, the requests one group is split into, other callers sending the same prompt), and each
  row only the tokens it has sampled, in a buffer that grows by doubling. A decode step attends to each prompt once
  for all of its rows and to each row's own tokens, then merges the two softmaxes (cascade attention, as
  shared-prefix decoding in SGLang and FlashInfer). A row costs its own length, not its prompt's, and no step
  copies a prompt. It replaces the model's attention (a function registered with transformers), so it is used only
  for the architectures whose attention it reproduces (`supports_shared_prefix`).
- `PaddedCache` is transformers' own cache: every row holds its prompt's keys and values, left-padded to the
  batch's width. Any model; rows join and leave only where the cache is made of plain growing layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer

ATTENTION_NAME = "rlctl_shared_prefix"
_STEP_ARGUMENT = "rlctl_attention_step"  # the model's forward passes it on to every attention call
# Decoder architectures whose attention is plain causal softmax attention after rotary embeddings (no sliding
# window, soft-capping or sinks), which the shared-prefix attention reproduces.
SHARED_PREFIX_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3"})
_FIRST_ROW_CAPACITY = 32  # sampled tokens a row buffer holds before it first doubles


class RowCache(Protocol):
    """The keys and values of a batch's rows, in the batch's row order."""

    @property
    def resizable(self) -> bool:
        """Rows can join (`add_rows` on a cache that holds rows) and leave (`keep_rows`)."""
        ...

    def add_rows(self, prompts: Sequence[tuple[int, ...]]) -> torch.Tensor:
        """Rows that read `prompts` (one each, in order) after the rows held; their next-token logits."""
        ...

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only the rows at these positions stay, in this order."""
        ...

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feeds each row its next token ([rows]); each row's next-token logits ([rows, vocabulary], float)."""
        ...


def supports_shared_prefix(config: Any) -> bool:
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return config.model_type in SHARED_PREFIX_MODEL_TYPES and all(kind == "full_attention" for kind in layer_types)


def use_shared_prefix(model: nn.Module) -> bool:
    """Switches `model` (the sampler's own copy: its config is its own) to the shared-prefix attention, where its
    architecture allows; from then on only a `SharedPrefixCache` can run it, else only a `PaddedCache`. Whether
    it did."""
    if not supports_shared_prefix(model.config):
        return False
    switch: Any = model.set_attn_implementation
    switch(ATTENTION_NAME)
    return True


def _left_padded(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The prompts as one left-padded batch: token ids, the mask of real tokens and each token's position."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for index, prompt in enumerate(prompts):
        input_ids[index, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[index, width - len(prompt) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _left_pad(tensor: torch.Tensor, width: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """`tensor` padded with `value` at the front of dimension `dim` to `width`."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    return functional.pad(tensor, [0, 0] * (tensor.dim() - 1 - dim) + [missing, 0], value=value)


def _beside(held: torch.Tensor, added: torch.Tensor, width: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """`added`'s rows after `held`'s, both left-padded with `value` to `width` in dimension `dim`."""
    return torch.cat([_left_pad(held, width, dim, value), _left_pad(added, width, dim, value)])


# --- transformers' own cache, a copy of the prompt per row ------------------------------------------------------


def _plain_growing_layers(cache: Any) -> bool:
    """Rows can be added to and dropped from a cache of plain growing layers (keys and values [rows, heads,
    length, dim]); any other kind (sliding windows, quantised, static) keeps its batch as it began."""
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class PaddedCache:
    """transformers' cache with every row's prompt in it, left-padded to the batch's width. Between calls,
    `_attention` ([rows, width]) covers every token fed so far and `_positions` ([rows, 1]) is each row's last."""

    def __init__(self, model: nn.Module, pad_id: int, device: torch.device) -> None:
        self._model = model
        self._pad_id = pad_id
        self._device = device
        self._cache: Any = None
        self._attention = torch.zeros((0, 0), dtype=torch.long, device=device)
        self._positions = torch.zeros((0, 1), dtype=torch.long, device=device)

    @property
    def resizable(self) -> bool:
        return self._cache is None or _plain_growing_layers(self._cache)

    def add_rows(self, prompts: Sequence[tuple[int, ...]]) -> torch.Tensor:
        """Each distinct prompt is read once and its cache copied for each of its rows, where the cache allows."""
        distinct: dict[tuple[int, ...], int] = {}
        sources = [distinct.setdefault(prompt, len(distinct)) for prompt in prompts]
        output, attention, positions = self._read(list(distinct))
        if len(distinct) < len(prompts):
            if _plain_growing_layers(output.cache):
                index = torch.tensor(sources, device=attention.device)
                output.cache.batch_select_indices(index)
                output.logits, attention, positions = output.logits[index], attention[index], positions[index]
            else:  # a cache whose rows cannot be copied: every row reads its prompt
                output, attention, positions = self._read(prompts)
        if self._cache is None:
            self._cache, self._attention, self._positions = output.cache, attention, positions[:, -1:]
        else:
            self._append(output.cache, attention, positions[:, -1:])
        return output.logits[:, -1, :].float()

    def _read(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        input_ids, attention, positions = _left_padded(prompts, self._pad_id, self._device)
        output = self._model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        return output, attention, positions

    def _append(self, cache: Any, attention: torch.Tensor, positions: torch.Tensor) -> None:
        """The new rows go beside the held ones, the shorter side's cache and mask padded on the left."""
        width = max(self._attention.shape[1], attention.shape[1])
        for layer, added in zip(self._cache.layers, cache.layers, strict=True):
            layer.keys = _beside(layer.keys, added.keys, width, 2)
            layer.values = _beside(layer.values, added.values, width, 2)
        self._attention = _beside(self._attention, attention, width, 1)
        self._positions = torch.cat([self._positions, positions])

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Then drops the leading columns that are padding in every row kept."""
        keep = torch.tensor(list(rows), dtype=torch.long, device=self._device)
        attention = self._attention[keep]
        padding = int((attention.shape[1] - attention.sum(dim=1)).min())
        self._attention = attention[:, padding:]
        self._positions = self._positions[keep]
        self._cache.batch_select_indices(keep)
        for layer in self._cache.layers:
            layer.keys, layer.values = layer.keys[:, :, padding:], layer.values[:, :, padding:]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        self._attention = torch.cat([self._attention, self._attention.new_ones((len(tokens), 1))], dim=1)
        self._positions = self._positions + 1
        output = self._model(
            input_ids=tokens[:, None],
            attention_mask=self._attention,
            position_ids=self._positions,
            cache=self._cache,
            use_cache=True,
        )
        self._cache = output.cache
        return output.logits[:, -1, :].float()


# --- shared prefixes ---------------------------------------------------------------------------------------------


@dataclass
class _Partial:
    """Softmax attention over part of the keys, not yet normalised: `weighted` is the values weighted by
    exp(score - peak), `total` the sum of those weights. Two parts merge into the attention over both."""

    weighted: torch.Tensor  # [..., dim]
    total: torch.Tensor  # [..., 1]
    peak: torch.Tensor  # [..., 1]

    @classmethod
    def over(cls, scores: torch.Tensor, values: torch.Tensor) -> _Partial:
        """`scores` [..., keys] (float, -inf where masked; at least one key each), `values` [..., keys, dim]."""
        peak = scores.amax(dim=-1, keepdim=True)
        weights = (scores - peak).exp_()
        weighted = torch.matmul(weights.to(values.dtype), values).float()
        return cls(weighted, weights.sum(dim=-1, keepdim=True), peak)

    def merged(self, other: _Partial) -> torch.Tensor:
        peak = torch.maximum(self.peak, other.peak)
        mine, theirs = (self.peak - peak).exp_(), (other.peak - peak).exp_()
        return (self.weighted * mine + other.weighted * theirs) / (self.total * mine + other.total * theirs)


def _shared_prefix_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls in each layer: the step of the `SharedPrefixCache` running the
    forward pass does the work (the mask is its own, so the model builds none)."""
    step = kwargs.get(_STEP_ARGUMENT)
    if step is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention runs only inside a SharedPrefixCache's forward pass")
    for unsupported in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise RuntimeError(f"{ATTENTION_NAME} attention does not support {unsupported}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return step.attend(module.layer_idx, query, key, value, scale), None


AttentionInterface.register(ATTENTION_NAME, _shared_prefix_attention)


class _PromptRead:
    """The forward pass over new prompts (left-padded): causal attention within each prompt, whose keys and
    values it keeps for the cache."""

    def __init__(self, mask: torch.Tensor) -> None:
        width = mask.shape[1]
        causal = torch.ones((width, width), dtype=torch.bool, device=mask.device).tril()
        # A padding query sees itself, so that no row of the softmax is empty (its output is never used).
        itself = torch.eye(width, dtype=torch.bool, device=mask.device)
        self._mask = ((causal & mask.bool()[:, None, :]) | itself)[:, None]
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
    ) -> torch.Tensor:
        self.keys[layer], self.values[layer] = key, value
        output = functional.scaled_dot_product_attention(
            query, key, value, attn_mask=self._mask, scale=scale, enable_gqa=key.shape[1] != query.shape[1]
        )
        return output.transpose(1, 2)


class _DecodeStep:
    """One decode step's attention: each row's new key and value are written into its buffer, then the row
    attends to its prompt (in a grid of prompts by rows, so each prompt's keys are read once) and to its own
    tokens, and the two parts are merged."""

    def __init__(self, cache: SharedPrefixCache) -> None:
        self._cache = cache
        rows, width = len(cache.row_lengths), cache.longest + 1
        columns = torch.arange(width, device=cache.row_lengths.device)
        own = columns[None, :] <= cache.row_lengths[:, None]  # the tokens each row has fed, this one included
        self._own_bias = torch.zeros((rows, 1, 1, width), device=own.device).masked_fill_(
            ~own[:, None, None], -torch.inf
        )
        self._row_index = torch.arange(rows, device=own.device)
        self._width = width

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
    ) -> torch.Tensor:
        cache = self._cache
        rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        row_keys, row_values = cache.row_keys[layer], cache.row_values[layer]
        row_keys[self._row_index, :, cache.row_lengths] = key[:, :, 0]
        row_values[self._row_index, :, cache.row_lengths] = value[:, :, 0]
        # Query heads in groups per key/value head, as transformers' repeat_kv pairs them: [rows, kv_heads, g, dim].
        grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
        own_scores = torch.matmul(grouped, row_keys[:, :, : self._width].transpose(-1, -2)).float()
        own = _Partial.over(own_scores.mul_(scale).add_(self._own_bias), row_values[:, :, : self._width])
        shared = self._prompt_part(layer, grouped, scale)
        return own.merged(shared).to(query.dtype).reshape(rows, 1, heads, dim)

    def _prompt_part(self, layer: int, grouped: torch.Tensor, scale: float) -> _Partial:
        cache, grid = self._cache, self._cache.grid
        rows, kv_heads, group, dim = grouped.shape
        lines, depth = grid.lines, grid.depth
        # [lines * depth, ...] with each row at its cell, then [lines, kv_heads, depth * group, dim].
        cells = grouped.new_zeros((lines * depth, kv_heads, group, dim)).index_copy_(0, grid.cell, grouped)
        cells = cells.view(lines, depth, kv_heads, group, dim).transpose(1, 2).reshape(lines, kv_heads, -1, dim)
        keys, values = grid.per_line(cache.prompt_keys[layer]), grid.per_line(cache.prompt_values[layer])
        scores = torch.matmul(cells, keys.transpose(-1, -2)).float()
        part = _Partial.over(scores.mul_(scale).add_(grid.per_line(cache.prompt_bias)), values)

        def per_row(tensor: torch.Tensor) -> torch.Tensor:
            width = tensor.shape[-1]
            by_cell = tensor.view(lines, kv_heads, depth, group, width).transpose(1, 2)
            return by_cell.reshape(lines * depth, kv_heads, group, width).index_select(0, grid.cell)

        return _Partial(per_row(part.weighted), per_row(part.total), per_row(part.peak))


@dataclass(frozen=True)
class _Grid:
    """Rows laid out in lines of at most `depth` rows of one prompt: row r sits at cell `cell[r]` (its line *
    depth + its place in the line). Each prompt is one line, unless that would leave more than half of the cells
    empty (a prompt of many rows beside prompts of few): then the lines hold about the mean number of rows per
    prompt, and `line_prompt` names each line's prompt, whose keys that step gathers per line."""

    lines: int
    depth: int
    cell: torch.Tensor
    line_prompt: torch.Tensor | None  # None: line i is prompt i

    @classmethod
    def of(cls, row_prompt: torch.Tensor, prompts: int) -> _Grid:
        rows = len(row_prompt)
        counts = torch.bincount(row_prompt, minlength=prompts)  # every prompt held has rows
        order = torch.argsort(row_prompt, stable=True)
        starts = counts.cumsum(0) - counts
        place = torch.empty_like(row_prompt)
        place[order] = torch.arange(rows, device=row_prompt.device) - starts[row_prompt[order]]
        depth = int(counts.max())
        if prompts * depth <= 2 * rows:
            return cls(prompts, depth, row_prompt * depth + place, None)
        depth = -(-rows // prompts)
        lines_per_prompt = (counts + depth - 1) // depth
        first_line = lines_per_prompt.cumsum(0) - lines_per_prompt
        line = first_line[row_prompt] + place // depth
        line_prompt = torch.repeat_interleave(torch.arange(prompts, device=row_prompt.device), lines_per_prompt)
        return cls(len(line_prompt), depth, line * depth + place % depth, line_prompt)

    def per_line(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor of one entry per prompt as one entry per line."""
        return tensor if self.line_prompt is None else tensor.index_select(0, self.line_prompt)


class SharedPrefixCache:
    """Prompts (each once, left-padded to a common width) and rows (each its own sampled tokens)."""

    resizable = True

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self._model = model
        self._device = device
        self._prompt_index: dict[tuple[int, ...], int] = {}
        self.prompt_keys: list[torch.Tensor] = []  # per layer: [prompts, kv_heads, width, dim]
        self.prompt_values: list[torch.Tensor] = []
        self.prompt_bias = torch.zeros((0, 1, 1, 0), device=device)  # 0 on a prompt's tokens, -inf on padding
        self._prompt_lengths = torch.zeros(0, dtype=torch.long, device=device)
        self._prompt_logits = torch.zeros((0, 0), device=device)  # each prompt's next-token logits
        self.row_keys: list[torch.Tensor] = []  # per layer: [rows, kv_heads, capacity, dim]
        self.row_values: list[torch.Tensor] = []
        self.row_lengths = torch.zeros(0, dtype=torch.long, device=device)  # tokens each row has fed
        self._row_prompt = torch.zeros(0, dtype=torch.long, device=device)
        self.longest = 0  # the most tokens any row has fed
        self._grid: _Grid | None = None

    @property
    def prompt_count(self) -> int:
        return len(self._prompt_index)

    @property
    def grid(self) -> _Grid:
        if self._grid is None:
            self._grid = _Grid.of(self._row_prompt, self.prompt_count)
        return self._grid

    def add_rows(self, prompts: Sequence[tuple[int, ...]]) -> torch.Tensor:
        """Only the prompts not held already are read."""
        new = [prompt for prompt in dict.fromkeys(prompts) if prompt not in self._prompt_index]
        if new:
            self._read(new)
        index = torch.tensor([self._prompt_index[prompt] for prompt in prompts], device=self._device)
        self._row_prompt = torch.cat([self._row_prompt, index])
        self.row_lengths = torch.cat([self.row_lengths, torch.zeros_like(index)])
        self._grow_rows(len(prompts))
        self._grid = None
        return self._prompt_logits[index]

    def _read(self, prompts: list[tuple[int, ...]]) -> None:
        input_ids, mask, positions = _left_padded(prompts, 0, self._device)
        reading = _PromptRead(mask)
        output = self._model(
            input_ids=input_ids,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=1,
            **{_STEP_ARGUMENT: reading},
        )
        keys = [reading.keys[layer] for layer in sorted(reading.keys)]
        values = [reading.values[layer] for layer in sorted(reading.values)]
        bias = torch.zeros(mask.shape, device=self._device).masked_fill_(mask == 0, -torch.inf)[:, None, None, :]
        logits = output.logits[:, -1, :].float()
        if self.prompt_keys:  # beside the prompts held, the narrower side padded on the left
            width = max(self.prompt_bias.shape[-1], bias.shape[-1])
            keys = [_beside(held, new, width, 2) for held, new in zip(self.prompt_keys, keys, strict=True)]
            values = [_beside(held, new, width, 2) for held, new in zip(self.prompt_values, values, strict=True)]
            bias = _beside(self.prompt_bias, bias, width, 3, -torch.inf)
            logits = torch.cat([self._prompt_logits, logits])
        self.prompt_keys, self.prompt_values, self.prompt_bias, self._prompt_logits = keys, values, bias, logits
        self._prompt_lengths = torch.cat([self._prompt_lengths, mask.sum(dim=1)])
        for prompt in prompts:
            self._prompt_index[prompt] = len(self._prompt_index)

    def _grow_rows(self, added: int) -> None:
        """Room for `added` more rows, each with the capacity of the others (a first batch: a small one)."""
        capacity = self.row_keys[0].shape[2] if self.row_keys else _FIRST_ROW_CAPACITY
        self.row_keys = self._with_empty_rows(self.row_keys, self.prompt_keys, added, capacity)
        self.row_values = self._with_empty_rows(self.row_values, self.prompt_values, added, capacity)

    @staticmethod
    def _with_empty_rows(
        held: list[torch.Tensor], like: list[torch.Tensor], added: int, capacity: int
    ) -> list[torch.Tensor]:
        """Per layer, `held`'s rows and then `added` empty ones (heads and dim as in `like`)."""
        empty = [layer.new_zeros((added, layer.shape[1], capacity, layer.shape[3])) for layer in like]
        return [torch.cat([rows, more]) for rows, more in zip(held, empty, strict=True)] if held else empty

    def keep_rows(self, rows: Sequence[int]) -> None:
        """A prompt no row reads any more is dropped, and then the columns that are padding in every prompt."""
        keep = torch.tensor(list(rows), dtype=torch.long, device=self._device)
        self.row_keys = [keys.index_select(0, keep) for keys in self.row_keys]
        self.row_values = [values.index_select(0, keep) for values in self.row_values]
        self.row_lengths = self.row_lengths[keep]
        self._row_prompt = self._row_prompt[keep]
        self.longest = int(self.row_lengths.max()) if len(keep) else 0
        self._grid = None
        read = torch.unique(self._row_prompt)  # sorted: the prompts keep their order
        if len(read) < self.prompt_count:
            self._keep_prompts(read)

    def _keep_prompts(self, read: torch.Tensor) -> None:
        kept = read.tolist()
        renumbered = torch.full((self.prompt_count,), -1, dtype=torch.long, device=self._device)
        renumbered[read] = torch.arange(len(kept), device=self._device)
        self._row_prompt = renumbered[self._row_prompt]
        by_index = sorted(self._prompt_index, key=self._prompt_index.__getitem__)
        self._prompt_index = {by_index[old]: new for new, old in enumerate(kept)}
        self._prompt_lengths = self._prompt_lengths[read]
        self._prompt_logits = self._prompt_logits[read]
        padding = self.prompt_bias.shape[-1] - int(self._prompt_lengths.max())
        self.prompt_keys = [keys[read, :, padding:] for keys in self.prompt_keys]
        self.prompt_values = [values[read, :, padding:] for values in self.prompt_values]
        self.prompt_bias = self.prompt_bias[read][..., padding:]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        self._make_room(self.longest + 1)
        positions = self._prompt_lengths[self._row_prompt] + self.row_lengths
        output = self._model(
            input_ids=tokens[:, None],
            position_ids=positions[:, None],
            use_cache=False,
            **{_STEP_ARGUMENT: _DecodeStep(self)},
        )
        self.row_lengths = self.row_lengths + 1
        self.longest += 1
        return output.logits[:, -1, :].float()

    def _make_room(self, columns: int) -> None:
        """Row buffers of at least `columns` columns (doubling, so that a row's tokens are copied O(1) times)."""
        capacity = self.row_keys[0].shape[2]
        if columns <= capacity:
            return
        wider = max(columns, 2 * capacity)

        def widened(tensor: torch.Tensor) -> torch.Tensor:
            return functional.pad(tensor, [0, 0, 0, wider - capacity])

        self.row_keys = [widened(keys) for keys in self.row_keys]
        self.row_values = [widened(values) for values in self.row_values]
