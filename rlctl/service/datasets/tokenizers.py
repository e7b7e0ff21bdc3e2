"""Which token counter a request gets, by name, without ever reading a path the caller wrote.

A request names a tokenizer (letters, digits, `_`, `-`): `approx` (the stated fallback), `tiny` (the tiny local
model's tokenizer), or a subdirectory of one of `RLCTL_TOKENIZER_DIRS` or of `{data_dir}/models`. Without a name,
`RLCTL_DATASET_TOKENIZER` decides; without that, the run's tokenizer (`RLCTL_TOKENIZER_NAME`) when it is in the
local Hugging Face cache, else `approx`. Nothing is downloaded.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from rlctl.service.datasets.errors import UnknownTokenizer
from rlctl.service.names import validate_name
from rlctl.service.settings import Settings
from rlctl.trajectories.tokens import ApproximateTokenCounter, HuggingFaceTokenCounter, TokenCounter

logger = logging.getLogger("rlctl.datasets")

APPROX = "approx"
TINY = "tiny"
RUN = "run"  # the run tokenizer (RLCTL_TOKENIZER_NAME), when the local Hugging Face cache holds it


class LockedCounter:
    """Shares one tokenizer between threads (fast tokenizers are not safe to call concurrently)."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._lock = threading.Lock()
        self.name = counter.name

    def count(self, text: str) -> int:
        with self._lock:
            return self._counter.count(text)


class MemoCounter:
    """Remembers the counts of one record's turns: a compressed record keeps most of its turn strings, and
    Python caches a string's hash, so counting them again for statistics is a dictionary lookup."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._memo: dict[str, int] = {}
        self.name = counter.name

    def count(self, text: str) -> int:
        known = self._memo.get(text)
        if known is None:
            known = self._memo[text] = self._counter.count(text)
        return known

    def forget(self) -> None:
        self._memo.clear()


def tokenizer_roots(settings: Settings) -> list[Path]:
    extra = [Path(p).expanduser().resolve() for p in settings.tokenizer_dirs.split(":") if p.strip()]
    return [*extra, settings.data_path / "models"]


def available_tokenizers(settings: Settings) -> list[str]:
    names = {APPROX, TINY}
    for root in tokenizer_roots(settings):
        if root.is_dir():
            names.update(entry.name for entry in root.iterdir() if _is_tokenizer_dir(entry))
    return sorted(names)


def resolve_tokenizer(settings: Settings, name: str | None) -> str:
    """The canonical name a request's tokenizer resolves to; raises UnknownTokenizer. Cheap: loads nothing."""
    chosen = name or settings.dataset_tokenizer
    if chosen is None:
        return RUN if run_tokenizer_dir(settings) is not None else APPROX
    validate_name(chosen, "tokenizer name")
    if chosen in (APPROX, TINY) or (chosen == RUN and run_tokenizer_dir(settings) is not None):
        return chosen
    if _named_dir(settings, chosen) is not None:
        return chosen
    raise UnknownTokenizer(
        f"no tokenizer named {chosen!r}", {"tokenizer": chosen, "available": available_tokenizers(settings)}
    )


def load_counter(settings: Settings, resolved: str) -> TokenCounter:
    """A fresh counter for a resolved name (one per job or request: tokenizers are not thread-safe)."""
    if resolved == APPROX:
        return ApproximateTokenCounter()
    if resolved == TINY:
        from rlctl.trainer.tiny_model import init_tiny_model  # builds locally, once; no download

        return HuggingFaceTokenCounter(init_tiny_model(settings.tiny_model_dir))
    directory = run_tokenizer_dir(settings) if resolved == RUN else _named_dir(settings, resolved)
    if directory is None:
        raise UnknownTokenizer(f"tokenizer {resolved!r} is no longer available", {"tokenizer": resolved})
    return HuggingFaceTokenCounter(directory)


def _named_dir(settings: Settings, name: str) -> Path | None:
    for root in tokenizer_roots(settings):
        candidate = root / name
        if _is_tokenizer_dir(candidate) and candidate.resolve().parent == root.resolve():
            return candidate
    return None


def _is_tokenizer_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))


_run_dirs: dict[str, Path | None] = {}


def run_tokenizer_dir(settings: Settings) -> Path | None:
    """The run tokenizer's directory in the local Hugging Face cache, or None (never downloads). Looked up once per
    process; the service does it at start-up (docs/DATASETS.md#tokenizers says why)."""
    model = settings.tokenizer_name
    if model not in _run_dirs:
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model, local_files_only=True, allow_patterns=["tokenizer*"]))
            _run_dirs[model] = path if _is_tokenizer_dir(path) else None
        except Exception:  # noqa: BLE001 - not cached (or not a hub id): the fallback counts
            _run_dirs[model] = None
        if _run_dirs[model] is None:
            logger.info("tokenizer %s is not available locally; token counts use %s", model, APPROX)
    return _run_dirs[model]
