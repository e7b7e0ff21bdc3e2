"""Fixtures for the trajectory-dataset tests: the real public trajectories and a locally built tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.trajectories.importing import ImportedRecord
from rlctl.trajectories.reading import ItemError
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.tokens import ApproximateTokenCounter, HuggingFaceTokenCounter
from tests.conftest import TEST_DATA
from tests.datasets.realdata import EXPECTED_FILES, import_file


@pytest.fixture(scope="session")
def trajectories_dir() -> Path:
    return TEST_DATA / "trajectories"


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
