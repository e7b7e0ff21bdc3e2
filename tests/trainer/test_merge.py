"""`rlctl model merge`: a checkpoint's LoRA adapter merged into the base gives a plain model whose logits are those
of base + adapter as the trainer computes them, loaded without peft."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlctl.trainer.backends.local import LocalBackend
from rlctl.trainer.merge import MergeError, merge_adapter
from tests.trainer.test_local_backend import make_config


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, list[int]]:
    """A checkpoint whose adapter is far from zero (every LoRA matrix drawn at random), and the logits the backend
    gives with it on a prompt."""
    backend = LocalBackend(make_config(tiny_model_dir, tmp_path_factory.mktemp("run"), lora_rank=4, lora_alpha=16))
    try:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, parameter in backend.model.named_parameters():
                if parameter.requires_grad and "lora_" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        checkpoint = Path(backend.save_checkpoint(1).path)
        tokens = backend.tokenizer.encode("merge 1234", add_special_tokens=False)
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor([tokens])).logits.float()
            base = None
            with backend.model.disable_adapter():
                base = backend.model(input_ids=torch.tensor([tokens])).logits.float()
        assert not torch.allclose(logits, base, atol=1e-3)  # the adapter changes the model: the test can fail
    finally:
        backend.close()
    return checkpoint, logits, tokens


def test_merged_logits_equal_base_plus_adapter(tiny_model_dir: Path, trained, tmp_path: Path) -> None:
    checkpoint, expected, tokens = trained
    output = tmp_path / "merged"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlctl.service.cli",
            "model",
            "merge",
            str(tiny_model_dir),
            str(checkpoint),
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert not list(output.glob("adapter_*")), "the output is a plain model, not an adapter"
    merged = AutoModelForCausalLM.from_pretrained(str(output), dtype=torch.float32)
    with torch.no_grad():
        logits = merged(input_ids=torch.tensor([tokens])).logits.float()
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert AutoTokenizer.from_pretrained(str(output)).encode("merge 1234", add_special_tokens=False) == tokens


def test_merge_refuses_what_is_not_a_checkpoint_or_a_new_directory(
    tiny_model_dir: Path, trained, tmp_path: Path
) -> None:
    checkpoint, _, _ = trained
    with pytest.raises(MergeError, match="not a LoRA checkpoint"):
        merge_adapter(str(tiny_model_dir), tmp_path, tmp_path / "out")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(MergeError, match="not empty"):
        merge_adapter(str(tiny_model_dir), checkpoint, taken)
    assert (taken / "keep.txt").read_text() == "mine"
