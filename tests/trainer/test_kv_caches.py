"""The sampler's two caches on the tiny model: the shared-prefix cache holds each prompt once, whatever its rows,
and gives the same next-token logits as transformers' own cache through joins, leaves and decode steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import GPT2Config, LlamaConfig, Qwen3Config

from tests.trainer.test_local_backend import chat_prompt, make_config
from trainer.backends.kv_caches import (
    PaddedCache,
    RowCache,
    SharedPrefixCache,
    supports_shared_prefix,
    use_shared_prefix,
)
from trainer.backends.local import LocalBackend
from trainer.backends.sampler import sampler_copy


def test_shared_prefix_is_used_only_for_plain_causal_attention() -> None:
    assert supports_shared_prefix(Qwen3Config())
    assert supports_shared_prefix(LlamaConfig())
    sliding = Qwen3Config(use_sliding_window=True, sliding_window=8, max_window_layers=0, num_hidden_layers=2)
    assert "sliding_attention" in sliding.layer_types
    assert not supports_shared_prefix(sliding)
    assert not supports_shared_prefix(GPT2Config())


@pytest.fixture
def backend(tiny_model_dir: Path, tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(make_config(tiny_model_dir, tmp_path / "run"))
    yield backend
    backend.close()


class Counted:
    """A sampler copy of the backend's model whose forward passes are counted."""

    def __init__(self, backend: LocalBackend, shared_prefix: bool) -> None:
        self.model: nn.Module = sampler_copy(backend.model)
        self.model.eval()
        if shared_prefix:
            assert use_shared_prefix(self.model)
        self.passes = 0
        self.model.register_forward_pre_hook(self._count)

    def _count(self, *_: object) -> None:
        self.passes += 1


def test_the_shared_prefix_cache_matches_transformers_cache_and_holds_each_prompt_once(
    backend: LocalBackend,
) -> None:
    one, two, three = (chat_prompt(backend, "Echo: " + "7" * length) for length in (3, 40, 11))
    shared_model, padded_model = Counted(backend, shared_prefix=True), Counted(backend, shared_prefix=False)
    shared = SharedPrefixCache(shared_model.model, backend._device)
    padded = PaddedCache(padded_model.model, backend.tokenizer.pad_token_id or 0, backend._device)
    caches: tuple[RowCache, RowCache] = (shared, padded)

    def same(results: list[torch.Tensor]) -> torch.Tensor:
        assert results[0].shape == results[1].shape
        torch.testing.assert_close(results[0], results[1], atol=1e-4, rtol=1e-4)
        return results[0]

    def decode(logits: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):
            tokens = logits.argmax(dim=-1)
            logits = same([cache.decode(tokens) for cache in caches])
        return logits

    with torch.inference_mode():
        logits = same([cache.add_rows([tuple(one)] * 4 + [tuple(two)] * 2) for cache in caches])
        assert shared.prompt_count == 2 and shared.prompt_keys[0].shape[0] == 2  # not one per row
        assert shared.row_keys[0].shape[0] == 6 and shared.grid.line_prompt is None  # a line per prompt
        logits = decode(logits, 5)
        # Rows join: one prompt already held (not read again) and a new one, shorter than the held width.
        passes = shared_model.passes
        joined = same([cache.add_rows([tuple(two)] * 3 + [tuple(three)]) for cache in caches])
        assert shared_model.passes == passes + 1 and shared.prompt_count == 3
        logits = decode(torch.cat([logits, joined]), 40)  # past the first row buffer's capacity: it doubles
        assert shared.row_keys[0].shape[2] >= 46
        # The rows of the longest prompt leave: it is dropped, with the columns only it needed.
        kept = [0, 1, 2, 3, 9]
        for cache in caches:
            cache.keep_rows(kept)
        logits = logits[kept]
        assert shared.prompt_count == 2
        assert shared.prompt_keys[0].shape[2] == max(len(one), len(three))
        decode(logits, 5)


def test_a_prompt_of_many_rows_beside_prompts_of_few_is_read_in_lines(backend: LocalBackend) -> None:
    """Twelve rows of one prompt and one row each of two others: one line per prompt would leave most cells of
    the grid empty, so the twelve rows take lines of their own (about the mean per prompt), with the same logits."""
    many, few, other = (tuple(chat_prompt(backend, "Echo: " + "3" * length)) for length in (2, 9, 30))
    shared_model, padded_model = Counted(backend, shared_prefix=True), Counted(backend, shared_prefix=False)
    shared = SharedPrefixCache(shared_model.model, backend._device)
    padded = PaddedCache(padded_model.model, backend.tokenizer.pad_token_id or 0, backend._device)
    with torch.inference_mode():
        results = [cache.add_rows([many] * 12 + [few, other]) for cache in (shared, padded)]
        for _ in range(6):
            torch.testing.assert_close(results[0], results[1], atol=1e-4, rtol=1e-4)
            tokens = results[0].argmax(dim=-1)
            results = [cache.decode(tokens) for cache in (shared, padded)]
        grid = shared.grid
        assert grid.line_prompt is not None and grid.depth == 5 and grid.lines == 5  # 12 rows in 3 lines, 1, 1
        assert sorted(grid.cell.tolist()) == sorted(set(grid.cell.tolist()))  # a cell per row
