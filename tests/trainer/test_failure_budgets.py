"""Failure budgets: a trainer whose sampling calls keep failing ends promptly with a typed reason, and the
inference server answers each failure in OpenAI's shape (502), never a bare 500.

The fault is real: the `tinker` backend, through the real SDK, talks to the loopback Tinker server
(tinker_loopback.py, the stand-in for the paid service) set to answer every sample with bytes the SDK rejects.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from rlctl.trainer.failures import SAMPLING_FAILED, TRAINING_FAILED, BudgetExhausted, FailureBudget
from tests.support.live import free_port
from tests.trainer.pipeline import (
    child_environment,
    metric_lines,
    processes,
    start_api,
    start_trainer,
    trainer_state,
    wait_http,
    write_run_yaml,
)
from tests.trainer.tinker_loopback import LoopbackServer, LoopbackTinker

BUDGET = 5
# The trainer checks its budget at every batch poll (0.2 s); the bound leaves room for a slow shared CPU.
FAIL_WITHIN_S = 30.0


def test_a_budget_counts_consecutive_failures_and_a_success_refills_it() -> None:
    budget = FailureBudget(SAMPLING_FAILED, 3, "sampling calls")
    budget.failure(RuntimeError("one"))
    budget.failure(RuntimeError("two"))
    budget.success()
    budget.failure(RuntimeError("three"))
    budget.failure(RuntimeError("four"))
    budget.check()  # two in a row since the success: within the budget
    budget.failure("five")
    with pytest.raises(BudgetExhausted) as raised:
        budget.check()
    assert raised.value.kind == SAMPLING_FAILED
    assert "3 consecutive sampling calls failed (budget 3)" in str(raised.value) and "five" in str(raised.value)
    assert budget.state().total == 5
    with pytest.raises(ValueError):
        FailureBudget(TRAINING_FAILED, 0, "training steps")


def test_sampling_that_always_fails_fails_the_trainer_with_its_kind(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    service = LoopbackTinker(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    service.reject_samples = True
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=3,
        group_size=4,
        batch_size=8,
        tinker={"backend": "tinker", "base_model": "Qwen/Qwen3-8B", "sampling_error_budget": BUDGET},
    )
    with LoopbackServer(service, free_port()) as server, processes() as start:
        environment = child_environment(tmp_path / "var", TINKER_BASE_URL=server.url, TINKER_API_KEY="tml-loopback")
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        base = f"http://127.0.0.1:{inference_port}"
        wait_http(f"{base}/health", trainer, 90)

        answers = []
        started = time.monotonic()
        while trainer.alive and len(answers) < BUDGET:
            response = httpx.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
            answers.append(response)
        for response in answers:
            assert response.status_code == 502, response.text
            error = response.json()["error"]
            assert error["type"] == "server_error" and error["code"] == "backend_error"
            assert "failed to sample" in error["message"]

        assert trainer.wait(FAIL_WITHIN_S) == 1, trainer.log_tail()
        assert time.monotonic() - started < FAIL_WITHIN_S + 60
        state = trainer_state(run_dir)
        assert state["status"] == "failed" and state["failure_kind"] == SAMPLING_FAILED
        assert f"{BUDGET} consecutive sampling calls failed" in state["error"]
        assert state["step"] == 0 and not [r for r in metric_lines(run_dir) if "metrics" in r]
