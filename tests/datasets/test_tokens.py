"""Token counters: a real Hugging Face tokenizer from a local directory, and the stated fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rlctl.service.datasets.errors import UnknownTokenizer
from rlctl.service.datasets.tokenizers import APPROX, load_counter, resolve_tokenizer
from rlctl.service.settings import Settings
from rlctl.trajectories.tokens import (
    ApproximateTokenCounter,
    HuggingFaceTokenCounter,
    TokenCounter,
    fit_to_token_budget,
    record_token_count,
)


def test_hugging_face_counter_counts_what_the_tokenizer_encodes(tokenizer_dir: Path, all_real_records) -> None:
    counter = HuggingFaceTokenCounter(tokenizer_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    _, record = all_real_records[0]
    for turn in record.turns[:3]:
        assert counter.count(turn.value) == len(tokenizer.encode(turn.value, add_special_tokens=False)) > 0
    assert counter.count("") == 0
    assert isinstance(counter, TokenCounter) and counter.name.startswith("hf:")


def test_texts_longer_than_the_models_context_are_counted_in_full(tokenizer_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.model_max_length = 64
    tokenizer.save_pretrained(tmp_path)
    text = "The agent ran the test suite again. " * 100
    assert HuggingFaceTokenCounter(tmp_path).count(text) == len(tokenizer.encode(text, add_special_tokens=False)) > 64


def settings_without_run_tokenizer(tmp_path: Path, **values: Any) -> Settings:
    """Settings whose run tokenizer no local cache holds, so only the given tokenizer directories exist."""
    return Settings(_env_file=None, data_dir=tmp_path / "data", tokenizer_name="rlctl-tests/never-cached", **values)


def test_a_missing_tokenizer_directory_is_an_error_not_a_download(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        HuggingFaceTokenCounter(tmp_path / "absent")
    settings = settings_without_run_tokenizer(tmp_path, tokenizer_dirs=str(tmp_path))
    with pytest.raises(UnknownTokenizer):
        resolve_tokenizer(settings, "absent")
    resolved = resolve_tokenizer(settings, None)
    assert resolved == APPROX and isinstance(load_counter(settings, resolved), ApproximateTokenCounter)


def test_default_counter_uses_a_local_tokenizer_when_there_is_one(tokenizer_dir: Path, tmp_path: Path) -> None:
    settings = settings_without_run_tokenizer(
        tmp_path, tokenizer_dirs=str(tokenizer_dir.parent), dataset_tokenizer=tokenizer_dir.name
    )
    resolved = resolve_tokenizer(settings, None)
    assert resolved == tokenizer_dir.name
    assert isinstance(load_counter(settings, resolved), HuggingFaceTokenCounter)


def test_fallback_counts_words_digits_symbols_and_line_breaks() -> None:
    counter = ApproximateTokenCounter()
    assert counter.count("") == 0
    assert counter.count("hello world") == 2
    assert counter.count("internationalization") == 4  # 20 letters, one token per started 5
    assert counter.count("12345") == 2 and counter.count("x = 1;\n\n") == 5
    assert counter.count("xin chào") == 3  # "xin" (Latin run), "ch" (Latin run), "ào" (other letters)
    assert counter.name == "approx-regex-v1"


def test_fallback_is_a_reasonable_estimate_on_real_trajectories(all_real_records, hf_counter) -> None:
    fallback = ApproximateTokenCounter()
    approx = sum(record_token_count(record, fallback) for _, record in all_real_records)
    characters = sum(len(turn.value) for _, record in all_real_records for turn in record.turns)
    real = sum(record_token_count(record, hf_counter) for _, record in all_real_records[:50])
    assert 2.0 < characters / approx < 5.0  # the usual "about 4 characters per token", give or take
    assert real > 0


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=400), st.integers(1, 60))
def test_fit_to_token_budget_never_exceeds_the_budget(text: str, budget: int) -> None:
    counter = ApproximateTokenCounter()
    fitted = fit_to_token_budget(text, counter, budget)
    assert counter.count(fitted) <= budget
    if counter.count(text) <= budget:
        assert fitted == text
    else:
        assert fitted.endswith("…") or fitted == ""


def test_fit_to_token_budget_with_a_real_tokenizer_keeps_a_prefix(hf_counter) -> None:
    text = "The agent listed the files, opened the parser and fixed the tuple match. " * 40
    fitted = fit_to_token_budget(text, hf_counter, 50)
    assert hf_counter.count(fitted) <= 50 and text.startswith(fitted.removesuffix(" …"))
    assert hf_counter.count(fitted) >= 40  # it uses most of the budget
