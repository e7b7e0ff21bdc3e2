"""The tiny model is a real Qwen3 with a local tokenizer that atroposlib and transformers can load."""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.trainer.tiny_model import default_tiny_model_dir, init_tiny_model


def test_tiny_model_loads_like_any_hub_model(tiny_model_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen3" and config.vocab_size == len(tokenizer)
    assert not config.tie_word_embeddings
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Echo: 1234"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nEcho: 1234<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert tokenizer.decode(ids) == prompt
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nEcho: 1234\nassistant\n"
    assert all(len(tokenizer.encode(digit, add_special_tokens=False)) == 1 for digit in "0123456789")


def test_init_is_idempotent(tmp_path: Path) -> None:
    directory = default_tiny_model_dir(tmp_path)
    assert directory == tmp_path / "models" / "tiny-qwen3"
    init_tiny_model(directory, seed=3)
    weights = (directory / "model.safetensors").read_bytes()
    assert init_tiny_model(directory, seed=4) == directory
    assert (directory / "model.safetensors").read_bytes() == weights  # not rebuilt
    assert json.loads((directory / "rlctl_tiny_model.json").read_text())["seed"] == 3
    assert not list(tmp_path.glob("models/.*tmp*"))
