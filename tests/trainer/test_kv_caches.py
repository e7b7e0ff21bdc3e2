"""The sampler's two caches on the tiny model: the shared-prefix cache holds each prompt once, whatever its rows,
and gives the same next-token logits as transformers' own cache through joins, leaves and decode steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, Qwen3Config

from rlctl.trainer.backends.kv_caches import (
    PaddedCache,
    RowCache,
    SharedPrefixCache,
    supports_shared_prefix,
    use_shared_prefix,
)
from rlctl.trainer.backends.local import LocalBackend
from rlctl.trainer.backends.sampler import sampler_copy
from tests.trainer.test_local_backend import chat_prompt, make_config


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


class BothCaches:
    """Each kind of cache over a sampler copy of the backend's model, driven alike: every call must give both the
    same next-token logits. The shared-prefix model's forward passes are counted."""

    def __init__(self, backend: LocalBackend) -> None:
        shared_model, padded_model = sampler_copy(backend.model), sampler_copy(backend.model)
        assert use_shared_prefix(shared_model)
        self.passes = 0
        shared_model.register_forward_pre_hook(self._count)
        self.shared = SharedPrefixCache(shared_model, backend._device)
        self.padded = PaddedCache(padded_model, backend.tokenizer.pad_token_id or 0, backend._device)

    def _count(self, *_: object) -> None:
        self.passes += 1

    def same(self, call: Callable[[RowCache], torch.Tensor]) -> torch.Tensor:
        shared, padded = call(self.shared), call(self.padded)
        assert shared.shape == padded.shape
        torch.testing.assert_close(shared, padded, atol=1e-4, rtol=1e-4)
        return shared

    def decode(self, logits: torch.Tensor, steps: int) -> torch.Tensor:
        """`steps` greedy tokens for every row."""
        for _ in range(steps):
            tokens = logits.argmax(dim=-1)
            logits = self.same(lambda cache: cache.decode(tokens))  # noqa: B023 - called at once
        return logits


def test_the_shared_prefix_cache_matches_transformers_cache_and_holds_each_prompt_once(
    backend: LocalBackend,
) -> None:
    one, two, three = (tuple(chat_prompt(backend, "Echo: " + "7" * length)) for length in (3, 40, 11))
    caches = BothCaches(backend)
    shared = caches.shared
    with torch.inference_mode():
        logits = caches.same(lambda cache: cache.add_rows([one] * 4 + [two] * 2))
        assert shared.prompt_count == 2 and shared.prompt_keys[0].shape[0] == 2  # not one per row
        assert shared.row_keys[0].shape[0] == 6 and shared.grid.line_prompt is None  # a line per prompt
        logits = caches.decode(logits, 5)
        # Rows join: one prompt already held (not read again) and a new one, shorter than the held width.
        passes = caches.passes
        joined = caches.same(lambda cache: cache.add_rows([two] * 3 + [three]))
        assert caches.passes == passes + 1 and shared.prompt_count == 3
        logits = caches.decode(torch.cat([logits, joined]), 40)  # past the first row buffer's capacity: it doubles
        assert shared.row_keys[0].shape[2] >= 46
        # The rows of the longest prompt leave: it is dropped, with the columns only it needed.
        kept = [0, 1, 2, 3, 9]
        for cache in (caches.shared, caches.padded):
            cache.keep_rows(kept)
        assert shared.prompt_count == 2
        assert shared.prompt_keys[0].shape[2] == max(len(one), len(three))
        caches.decode(logits[kept], 5)


def test_a_prompt_of_many_rows_beside_prompts_of_few_is_read_in_lines(backend: LocalBackend) -> None:
    """Twelve rows of one prompt and one row each of two others: one line per prompt would leave most cells of
    the grid empty, so the twelve rows take lines of their own (about the mean per prompt), with the same logits."""
    many, few, other = (tuple(chat_prompt(backend, "Echo: " + "3" * length)) for length in (2, 9, 30))
    caches = BothCaches(backend)
    with torch.inference_mode():
        caches.decode(caches.same(lambda cache: cache.add_rows([many] * 12 + [few, other])), 6)
        grid = caches.shared.grid
        assert grid.line_prompt is not None and grid.depth == 5 and grid.lines == 5  # 12 rows in 3 lines, 1, 1
        assert sorted(grid.cell.tolist()) == sorted(set(grid.cell.tolist()))  # a cell per row
