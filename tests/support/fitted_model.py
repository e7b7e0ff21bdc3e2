"""A tiny model fitted to answer one prompt with one tool call, so the servers' tool-call path runs on a real model
that emits a real call deterministically (greedy). A random tiny model never writes a well-formed `<tool_call>`;
a few dozen Adam steps on the one target string (about 5 s on one CPU core) make it, built once per session.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from rlctl.trainer.tiny_model import COMPLETE_MARKER
from tests.support.tiny_model import session_tiny_model

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_PROMPT = "Weather in Paris?"
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MAX_STEPS = 150
TARGET_LOSS = 0.02  # mean per-token loss at which greedy decoding reproduces the target

_lock = threading.Lock()


def fitted_tool_call_model() -> Path:
    """The session's tiny model, fitted so that the chat prompt [user: WEATHER_PROMPT] with tools [WEATHER_TOOL]
    is answered greedily by WEATHER_CALL then the end of the turn."""
    base = session_tiny_model()
    model = base.parent / "tiny-qwen3-tool-call"
    with _lock:
        if not (model / COMPLETE_MARKER).exists():
            _fit(base, model)
    return model


def _fit(base: Path, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": WEATHER_PROMPT}],
        tools=[WEATHER_TOOL["function"]],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    target_ids = tokenizer.encode(WEATHER_CALL + "<|im_end|>", add_special_tokens=False)
    inputs = torch.tensor([prompt_ids + target_ids])
    labels = torch.tensor([[-100] * len(prompt_ids) + target_ids])  # only the reply is learnt
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(MAX_STEPS):
        loss = model(input_ids=inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < TARGET_LOSS:
            break
    else:
        raise RuntimeError(f"the tiny model did not fit the tool call in {MAX_STEPS} steps (loss {loss.item():.3f})")
    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(base, staging)  # tokenizer, chat template, marker
    model.save_pretrained(staging)
    staging.rename(directory)
