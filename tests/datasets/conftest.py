"""Fixtures for the trajectory-dataset tests: the real public trajectories and a locally built tokenizer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from service.datasets.importing import ImportedRecord, import_lines
from service.datasets.reading import ItemError
from service.datasets.records import TrajectoryRecord
from service.datasets.tokens import ApproximateTokenCounter, HuggingFaceTokenCounter

REPO_ROOT = Path(__file__).resolve().parents[2]

# Every data file and the format auto-detection must give it, with its record count.
EXPECTED_FILES: dict[str, tuple[str, int]] = {
    "hermes-agent-fork-lucifexia-trajectory-samples.jsonl": ("sharegpt", 1),
    "llamafactory-glaive-toolcall-en-demo.json": ("sharegpt", 300),
    "llamafactory-reason-tool-use-demo-50.jsonl": ("llamafactory", 50),
    "mini-swe-agent-github-issue.traj.json": ("openai", 1),
    "nemo-gym-anyswe-hermes-rollouts.jsonl": ("responses", 5),
    "nemo-gym-anyterminal-hermes-rollouts.jsonl": ("responses", 5),
    "nemo-gym-conversational-tool-use-rollouts.jsonl": ("responses", 5),
    "nemo-gym-mini-swe-agent-2-rollouts.jsonl": ("responses", 5),
    "nemo-gym-newton-bench-rollouts.jsonl": ("responses", 5),
    "nemo-gym-xlam-fc-rollouts.jsonl": ("responses", 5),
    "openhands-multi-swe-bench-output.jsonl": ("openhands", 3),
    "openhands-sdk-fncall-messages.json": ("openai", 1),
    "openhands-sdk-llm-log-claude-sonnet-4.json": ("openai", 1),
    "openhands-sdk-llm-log-deepseek-nonfncall.json": ("openai", 1),
    "openhands-sdk-nonfncall-messages.json": ("openai", 1),
    "swe-agent-ctf-i-got-id.traj": ("swe_agent", 1),
    "swe-agent-function-calling-simple.traj": ("swe_agent", 1),
    "swe-agent-marshmallow-1867-function-calling.traj": ("swe_agent", 1),
    "swe-agent-pydicom-1458.traj": ("swe_agent", 1),
    "tau-bench-gpt-4o-airline.json": ("tau_bench", 192),
}


def shared_data_dir() -> Path:
    return Path(os.environ.get("RLCTL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def trajectories_dir() -> Path:
    path = shared_data_dir() / "trajectories"
    if not path.is_dir():
        pytest.fail(
            f"real trajectory data not found at {path}; set RLCTL_SHARED_DATA to the shared data directory"
        )
    return path


def import_file(path: Path, fmt: str = "auto") -> list[ImportedRecord | ItemError]:
    with path.open(encoding="utf-8") as lines:
        return list(import_lines(lines, fmt=fmt))


@pytest.fixture(scope="session")
def real_records(trajectories_dir: Path) -> dict[str, list[TrajectoryRecord]]:
    """All records of every real data file, by file name (imported once per session)."""
    loaded = {}
    for name in EXPECTED_FILES:
        outcomes = import_file(trajectories_dir / name)
        errors = [o for o in outcomes if isinstance(o, ItemError)]
        assert not errors, f"{name}: {errors[:3]}"
        loaded[name] = [o.record for o in outcomes if isinstance(o, ImportedRecord)]
    return loaded


@pytest.fixture(scope="session")
def all_real_records(real_records: dict[str, list[TrajectoryRecord]]) -> list[tuple[str, TrajectoryRecord]]:
    return [(name, record) for name, records in real_records.items() for record in records]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, trajectories_dir: Path) -> Path:
    """A real byte-level BPE tokenizer, trained here on trajectory text, saved as a Hugging Face directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    training_text = (trajectories_dir / "swe-agent-pydicom-1458.traj").read_text(encoding="utf-8")
    tokenizer.train_from_iterator(training_text.splitlines(), trainer=trainer)
    directory = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def hf_counter(tokenizer_dir: Path) -> HuggingFaceTokenCounter:
    return HuggingFaceTokenCounter(tokenizer_dir)


@pytest.fixture(scope="session")
def approx_counter() -> ApproximateTokenCounter:
    return ApproximateTokenCounter()


RecordFactory = Callable[..., TrajectoryRecord]
