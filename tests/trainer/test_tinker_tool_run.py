"""A multi-turn tool environment trained on the `tinker` backend: `run-api`, the trainer with the real `tinker` SDK,
and `environments/tool_lookup.py serve`, all real processes; each episode's turns are sampled through the trainer's
inference server, which samples through Tinker, and the episodes are trained through Tinker's forward_backward.

Stand-in: Tinker is a paid remote service this machine cannot reach, so `TINKER_BASE_URL` points at the loopback
server speaking its protocol (tests/trainer/tinker_loopback.py). Its model's replies are scripted here, as a
policy that has learnt the tool format would answer: call `lookup` or `guess` (at random, so a group's rewards
differ), then answer with what the tool returned. What is checked is what rlctl does with them: the conversation
continues across turns through Tinker sampling, and only the policy's two replies carry advantages in the data sent
to Tinker (the prompt, the template's text and the tool turn are masked), as on the local backend.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.support.live import free_port
from tests.trainer.pipeline import (
    TOOL_RUN_ENV,
    env_metrics_of,
    metrics_environment,
    run_pipeline,
    step_metrics,
    trainer_state,
)
from tests.trainer.test_tinker_backend import _tensor_tokens
from tests.trainer.tinker_loopback import LoopbackServer, LoopbackTinker, _tensor

pytestmark = pytest.mark.e2e

# Two steps: whatever step change the environment saw (atroposlib logs its metrics only then), the environment hook
# logs its last groups' metrics as it ends (rlctl/supervisor/envhooks/sitecustomize.py).
TOTAL_STEPS, GROUP_SIZE, BATCH_SIZE = 2, 4, 8
TOOL_TURN = "<|im_start|>tool\n"
CALLS = {
    "lookup": '\n<tool_call>\n{"name": "lookup", "arguments": {"key": "code"}}\n</tool_call>',
    "guess": '\n<tool_call>\n{"name": "guess", "arguments": {}}\n</tool_call>',
}


def scripted_policy(tokenizer: object) -> Callable[[list[int], np.random.Generator], list[int]]:
    """The remote model's replies: a call of either tool, then the tool's result as the answer."""

    def reply(prompt: list[int], rng: np.random.Generator) -> list[int]:
        text = tokenizer.decode(prompt)  # type: ignore[attr-defined]
        if TOOL_TURN in text:
            answer = text.rsplit(TOOL_TURN, 1)[1].split("<|im_end|>", 1)[0]
        else:
            answer = CALLS["lookup" if rng.random() < 0.5 else "guess"]
        return [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]  # type: ignore[attr-defined]

    return reply


def trained_spans(advantages: list[float]) -> list[tuple[int, int]]:
    """The [start, end) runs of positions with a non-zero advantage."""
    spans: list[tuple[int, int]] = []
    for index, value in enumerate(advantages):
        if value == 0.0:
            continue
        if spans and spans[-1][1] == index:
            spans[-1] = (spans[-1][0], index + 1)
        else:
            spans.append((index, index + 1))
    return spans


def test_a_multi_turn_tool_run_trains_through_tinker(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    service = LoopbackTinker(len(tokenizer), tokenizer.eos_token_id, replies=scripted_policy(tokenizer))
    run_dir = tmp_path / "tool_lookup"
    with LoopbackServer(service, free_port()) as server:
        environment = metrics_environment(
            tmp_path / "var",
            run_dir,
            TINKER_BASE_URL=server.url,
            TINKER_API_KEY="tml-loopback",  # the SDK insists on the prefix; the stand-in only records it
        )
        ended = run_pipeline(
            run_dir,
            model_dir=tiny_model_dir,
            total_steps=TOTAL_STEPS,
            environment=environment,
            timeout_s=300,
            environment_file="tool_lookup.py",
            group_size=GROUP_SIZE,
            batch_size=BATCH_SIZE,
            env=TOOL_RUN_ENV,
            tinker={"backend": "tinker", "base_model": "Qwen/Qwen3-8B", "max_token_trainer_length": 1536},
        )
    assert ended.exit_code == 0, ended.trainer.log_tail()
    assert "Traceback" not in ended.environment_log, ended.environment_log[-4000:]
    assert trainer_state(run_dir)["status"] == "completed"
    assert [record["step"] for record in step_metrics(run_dir)] == list(range(1, TOTAL_STEPS + 1))

    # every episode: a call, the tool's turn, an answer; the second turn's prompt carried the tool's result
    prompts = [
        tokenizer.decode([token for chunk in call["prompt"]["chunks"] for token in chunk["tokens"]])
        for call in service.calls("asample")
    ]
    assert any(TOOL_TURN in prompt for prompt in prompts) and any(TOOL_TURN not in prompt for prompt in prompts)
    logged = env_metrics_of(run_dir)
    agent = [metrics for metrics in logged if "agent/turns_per_episode" in metrics]
    assert agent and all(metrics["agent/turns_per_episode"] == 2.0 for metrics in agent), agent
    assert all(metrics["agent/tool_calls_per_episode"] == 1.0 for metrics in agent), agent

    # what reached Tinker: only the policy's two replies carry advantages
    trained = [message for message in service.calls("forward_backward") if not message.forward_only]
    assert trained and all(message.loss_fn == "importance_sampling" for message in trained)
    for message in trained:
        for datum in message.data:
            targets = [int(token) for token in _tensor(datum.loss_fn_inputs["target_tokens"])]
            advantages = [float(value) for value in _tensor(datum.loss_fn_inputs["advantages"])]
            inputs = [token for chunk in datum.model_input for token in _tensor_tokens(chunk)]
            assert inputs[1:] == targets[:-1] and len(advantages) == len(targets)
            call, answer = (tokenizer.decode(targets[start:end]) for start, end in trained_spans(advantages))
            assert call.removesuffix("<|im_end|>") in CALLS.values(), call
            assert answer.endswith("<|im_end|>") and answer.removesuffix("<|im_end|>").isdigit(), answer
