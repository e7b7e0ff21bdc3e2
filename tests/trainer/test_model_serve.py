"""`rlctl model serve DIR [--adapter CHECKPOINT]`: the trainer's OpenAI-compatible server over a local model, as
a real process on a loopback port."""

from __future__ import annotations

from pathlib import Path

import httpx

from rlctl.trainer.evaluate import backend_for
from tests.support.served_model import served_model
from tests.support.waiting import REQUEST_TIMEOUT


def chat(base_url: str) -> dict:
    body = {"messages": [{"role": "user", "content": "Echo: 1234"}], "max_tokens": 4, "temperature": 0}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_model_and_a_checkpoint_are_served_openai_style(tiny_model_dir: Path, tmp_path: Path) -> None:
    backend = backend_for({"base_model": str(tiny_model_dir), "lora_rank": 4, "device": "cpu"}, None, str(tmp_path))
    for parameter in backend.model.parameters():  # a checkpoint that differs from the base
        if parameter.requires_grad:
            parameter.data.normal_(0, 0.5)
    checkpoint = backend.save_checkpoint(1).path

    with served_model(str(tiny_model_dir)) as base_url:
        models = httpx.get(f"{base_url}/v1/models", timeout=REQUEST_TIMEOUT).json()
        assert models["data"][0]["id"] == str(tiny_model_dir)
        base_answer = chat(base_url)
        assert base_answer["choices"][0]["finish_reason"] in ("stop", "length")
    with served_model(str(tiny_model_dir), "--adapter", checkpoint) as base_url:
        adapted = chat(base_url)
    # greedy answers: the adapter changes what the model says
    assert adapted["choices"][0]["message"]["content"] != base_answer["choices"][0]["message"]["content"]
