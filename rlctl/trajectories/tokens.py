"""Token counting behind one small interface, so the caller decides which tokenizer counts.

``HuggingFaceTokenCounter`` loads a real tokenizer from a local directory (a run's tokenizer); nothing is ever
downloaded. ``ApproximateTokenCounter`` is the stated fallback when no tokenizer is available locally.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from rlctl.trajectories.records import TrajectoryRecord, Turn


@runtime_checkable
class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


class HuggingFaceTokenCounter:
    """Counts with ``transformers.AutoTokenizer`` loaded from a local directory (``local_files_only``)."""

    def __init__(self, tokenizer_dir: str | os.PathLike[str]) -> None:
        from transformers import AutoTokenizer  # heavy import, only when a real tokenizer is wanted

        path = os.fspath(tokenizer_dir)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"tokenizer directory not found: {path}")
        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.name = f"hf:{os.path.basename(os.path.normpath(path))}"

    def count(self, text: str) -> int:
        if not text:
            return 0
        # verbose=False: trajectories exceed the model's context by design; no warning per long text.
        return len(self._tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


class ApproximateTokenCounter:
    """Fallback "approx-regex-v1": a deterministic estimate of a byte-pair tokenizer, needing no files.

    Each run of Latin letters counts one token per started 5 letters, other letters (CJK, …) one per started
    2, each run of up to 3 digits one, each punctuation or symbol character one, each run of line breaks one;
    spaces are free (BPE merges them into the next word). On English prose and code this lands near the usual
    "4 characters per token" rule; treat it as an estimate, not a model's exact count.
    """

    name = "approx-regex-v1"
    _PIECES = re.compile(r"(?P<latin>[A-Za-z]+)|(?P<letters>[^\W\d_]+)|(?P<digits>\d{1,3})|(?P<breaks>\n+)|[^\s]")

    def count(self, text: str) -> int:
        total = 0
        for match in self._PIECES.finditer(text):
            kind = match.lastgroup
            if kind == "latin":
                total += math.ceil(len(match.group()) / 5)
            elif kind == "letters":
                total += math.ceil(len(match.group()) / 2)
            else:
                total += 1
        return total


def turn_token_counts(turns: Iterable[Turn], counter: TokenCounter) -> list[int]:
    return [counter.count(turn.value) for turn in turns]


def record_token_count(record: TrajectoryRecord, counter: TokenCounter) -> int:
    """Tokens of all turn texts (role headers of a chat template are not counted)."""
    return sum(turn_token_counts(record.turns, counter))


def fit_to_token_budget(text: str, counter: TokenCounter, max_tokens: int, ellipsis: str = " …") -> str:
    """The longest prefix of ``text`` within the budget, cut at a space if it can, ending in ``ellipsis``."""
    if counter.count(text) <= max_tokens:
        return text
    low, high = 0, len(text)
    while low < high:  # the largest prefix length whose shortened form fits
        middle = (low + high + 1) // 2
        if counter.count(_shortened(text, middle, ellipsis)) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return _shortened(text, low, ellipsis) if low else ""


def _shortened(text: str, length: int, ellipsis: str) -> str:
    prefix = text[:length]
    cut = prefix.rfind(" ")
    if cut > length // 2:
        prefix = prefix[:cut]
    return prefix.rstrip() + ellipsis
