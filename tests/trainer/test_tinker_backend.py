"""The `tinker` backend through the real `tinker` SDK against a loopback server speaking the Tinker protocol.

The real Tinker service is a paid remote service that cannot be reached from here, so the test points
`TINKER_BASE_URL` at `tinker_loopback.py` (the only stand-in in these tests). Everything else is real: the
trainer process, the SDK, `run-api`. The test posts scored groups to the Atropos API and checks what reached
the service: the LoRA config, one datum per rollout with shifted targets, sampler logprobs and advantages
zeroed on the prompt, the `importance_sampling` loss, Adam's parameters, weights saved for sampling after
every step, checkpoints, and sampling through the newest sampling client.

It runs twice: against the stand-in speaking the current protocol (SDK 0.38, the hosted service) and against it
speaking the older subset SkyRL's server speaks (tinker 0.25). The trainer is not told which: it detects the
protocol from the server, resumes and samples the way that protocol allows, and records as run warnings the
parameters the server declares no field for (and the top-k logprobs it returns none of).
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from rlctl.trainer.backends.base import StepOutcome
from rlctl.trainer.backends.tinker_backend import TinkerBackend
from rlctl.trainer.config import parse_config
from rlctl.trainer.grpo import prepare_batch
from tests.support.live import free_port
from tests.support.waiting import REQUEST_TIMEOUT
from tests.trainer.pipeline import (
    child_environment,
    metric_lines,
    processes,
    start_api,
    start_trainer,
    step_metrics,
    trainer_state,
    wait_for,
    wait_http,
    wait_registered,
    write_run_yaml,
)
from tests.trainer.tinker_loopback import LoopbackServer, LoopbackTinker, _tensor

pytestmark = pytest.mark.e2e

GROUP_SIZE, BATCH_SIZE = 4, 8
TRAINING_CALLS = ("forward_backward", "optim_step", "save_weights_for_sampler")


def scored_group(rng: random.Random) -> dict:
    prompt = [1] + [rng.randrange(5, 100) for _ in range(5)]
    completions = [[rng.randrange(5, 100) for _ in range(rng.randint(2, 4))] for _ in range(GROUP_SIZE)]
    return {
        "tokens": [prompt + c for c in completions],
        "masks": [[-100] * len(prompt) + c for c in completions],
        "scores": [rng.random() for _ in range(GROUP_SIZE)],
        "inference_logprobs": [[1.0] * len(prompt) + [-rng.uniform(1, 6) for _ in c] for c in completions],
    }


def expected_datums(groups: list[dict]) -> set[tuple]:
    """(inputs, targets, sampler logprobs, advantages) per rollout, as docs/TRAINER.md#grpo-step defines the datum."""
    expected = set()
    for group in groups:
        mean = sum(group["scores"]) / len(group["scores"])
        for tokens, masks, score, logprobs in zip(
            group["tokens"], group["masks"], group["scores"], group["inference_logprobs"], strict=True
        ):
            advantages = [round(score - mean, 4) if m != -100 else 0.0 for m in masks[1:]]
            rounded = tuple(round(v, 4) for v in logprobs[1:])
            expected.add((tuple(tokens[:-1]), tuple(tokens[1:]), rounded, tuple(advantages)))
    return expected


def sent_datums(message) -> set[tuple]:
    sent = set()
    for datum in message.data:
        inputs = tuple(int(t) for chunk in datum.model_input for t in _tensor_tokens(chunk))
        targets = tuple(int(t) for t in _tensor(datum.loss_fn_inputs["target_tokens"]))
        logprobs = tuple(round(float(v), 4) for v in _tensor(datum.loss_fn_inputs["logprobs"]))
        advantages = tuple(round(float(v), 4) for v in _tensor(datum.loss_fn_inputs["advantages"]))
        sent.add((inputs, targets, logprobs, advantages))
    return sent


def _tensor_tokens(chunk) -> list[int]:
    import numpy as np

    return np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()


@pytest.fixture(params=["current", "legacy"])
def loopback(tiny_model_dir: Path, request: pytest.FixtureRequest):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    service = LoopbackTinker(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, protocol=request.param)
    with LoopbackServer(service, free_port()) as server:
        yield service, server.url


# What the legacy stand-in's schemas (SkyRL's) leave out of what rlctl sends.
LEGACY_IGNORED = {
    "lora_config.train_mlp",
    "lora_config.train_attn",
    "lora_config.train_unembed",
    "adam_params.grad_clip_norm",
    "topk_sample_logprobs",
}


def test_trainer_drives_the_tinker_protocol(tiny_model_dir: Path, tmp_path: Path, loopback) -> None:
    service, tinker_url = loopback
    legacy = service.protocol == "legacy"
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=3,
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
        tinker={
            "backend": "tinker",
            "base_model": "Qwen/Qwen3-8B",
            "learning_rate": 0.05,
            "save_checkpoint_interval": 2,
        },
    )
    # A loopback key: the SDK insists on the tml- prefix; the server only records it.
    environment = child_environment(tmp_path / "var", TINKER_BASE_URL=tinker_url, TINKER_API_KEY="tml-loopback")
    api_url = f"http://127.0.0.1:{api_port}"
    rng = random.Random(0)
    batches = [[scored_group(rng) for _ in range(BATCH_SIZE // GROUP_SIZE)] for _ in range(4)]
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_registered(api_url, trainer, 90)

        [created] = service.calls("create_model")
        assert created["base_model"] == "Qwen/Qwen3-8B"
        assert created["lora_config"] == {
            "rank": 8,
            "seed": 0,
            "train_unembed": True,
            "train_mlp": True,
            "train_attn": True,
        }
        assert service.api_keys == {"tml-loopback"}

        for batch in batches[:2]:
            for group in batch:
                httpx.post(f"{api_url}/scored_data", json=group, timeout=REQUEST_TIMEOUT).raise_for_status()
        wait_for(lambda: len(step_metrics(run_dir)) == 2, 60, "two steps")

        # The inference server samples through the sampling client of the newest published weights.
        prompt = [1, 40, 41, 42]
        params = {"n": 3, "max_new_tokens": 5, "temperature": 1.0}
        results = httpx.post(
            f"http://127.0.0.1:{inference_port}/generate",
            json={"input_ids": prompt, "sampling_params": params, "top_logprobs_num": 2},
            timeout=REQUEST_TIMEOUT,
        ).json()
        assert len(results) == 3
        assert all(len(r["meta_info"]["output_token_logprobs"]) == r["meta_info"]["completion_tokens"] for r in results)
        [sampled] = service.calls("asample")
        published = [c for c in service.calls("save_weights_for_sampler") if not c.get("path")]
        assert len(published) == 3  # at start-up, then after steps 1 and 2
        newest_session = max(service.samplers, key=list(service.samplers).index)
        assert sampled["sampling_session_id"] == newest_session
        assert sampled["num_samples"] == 3 and sampled["sampling_params"]["max_tokens"] == 5
        assert [chunk["tokens"] for chunk in sampled["prompt"]["chunks"]] == [prompt]

        for group in batches[2]:
            httpx.post(f"{api_url}/scored_data", json=group, timeout=REQUEST_TIMEOUT).raise_for_status()
        assert trainer.wait(60) == 0, trainer.log_tail()
        completed = trainer_state(run_dir)

        # One more step in a restarted trainer: it resumes from the step-3 state, optimizer included.
        write_run_yaml(
            run_dir,
            model_dir=tiny_model_dir,
            api_port=api_port,
            inference_port=inference_port,
            total_steps=4,
            group_size=GROUP_SIZE,
            batch_size=BATCH_SIZE,
            tinker={"backend": "tinker", "base_model": "Qwen/Qwen3-8B", "learning_rate": 0.05},
        )
        resumed = start_trainer(start, config, environment, name="trainer-resumed")
        wait_http(f"http://127.0.0.1:{inference_port}/health", resumed, 90)
        for group in batches[3]:
            httpx.post(f"{api_url}/scored_data", json=group, timeout=REQUEST_TIMEOUT).raise_for_status()
        assert resumed.wait(60) == 0, resumed.log_tail()

        # A warm start: a new run (directory) whose weights, not optimiser state, are the step-3 checkpoint's.
        warm_dir, warm_port = tmp_path / "warm", free_port()
        warm_config = write_run_yaml(
            warm_dir,
            model_dir=tiny_model_dir,
            api_port=api_port,
            inference_port=warm_port,
            total_steps=1,
            group_size=GROUP_SIZE,
            batch_size=BATCH_SIZE,
            tinker={
                "backend": "tinker",
                "base_model": "Qwen/Qwen3-8B",
                "learning_rate": 0.05,
                "init_from": completed["checkpoints"][-1]["path"],
            },
        )
        warm = start_trainer(start, warm_config, environment, name="trainer-warm")
        wait_http(f"http://127.0.0.1:{warm_port}/health", warm, 90)
        for group in batches[0]:
            httpx.post(f"{api_url}/scored_data", json=group, timeout=REQUEST_TIMEOUT).raise_for_status()
        assert warm.wait(60) == 0, warm.log_tail()
        assert trainer_state(warm_dir)["step"] == 1  # its own count, from 0

    loaded, warm_loaded = service.calls("load_weights")
    assert loaded["path"] == completed["checkpoints"][-1]["path"] and loaded["optimizer"] is True
    assert warm_loaded["path"] == loaded["path"] and warm_loaded["optimizer"] is False
    created = service.calls("create_model")
    if legacy:  # create_model, then load_weights into that model as its first request
        assert len(created) == 3 and created[1]["lora_config"]["rank"] == 8
        assert loaded["model_id"] == f"{created[1]['session_id']}:train:{created[1]['model_seq_id']}"
    else:  # one load_weights creates the model
        assert len(created) == 1 and "model_id" not in loaded and loaded["model_seq_id"] is not None
    assert trainer_state(run_dir)["step"] == 4

    forward_backward = service.calls("forward_backward")[:4]  # the warm run's fifth is not the first run's
    assert all(message.loss_fn == "importance_sampling" and not message.forward_only for message in forward_backward)
    # One forward/backward per batch (Atropos may hand out batches formed together in any order).
    sent = sorted((frozenset(sent_datums(message)) for message in forward_backward), key=sorted)
    expected = sorted((frozenset(expected_datums(batch)) for batch in batches), key=sorted)
    assert sent == expected

    optim_steps = service.calls("optim_step")[:4]
    assert [step["adam_params"] for step in optim_steps] == [
        {
            "learning_rate": 0.05,
            "beta1": 0.9,
            "beta2": 0.95,
            "eps": 1e-08,
            "weight_decay": 0.0,
            "grad_clip_norm": 0.0,
        }
    ] * 4
    assert [c["path"] for c in service.calls("save_weights")] == ["step_2", "step_3", "step_4", "step_1"]

    state = completed
    assert state["status"] == "completed" and state["step"] == 3 and state["backend"] == "tinker"
    assert [c["step"] for c in state["checkpoints"]] == [2, 3]
    assert all(c["path"].startswith("tinker://") for c in state["checkpoints"])
    assert state["weights"].startswith("tinker://") and state["weights"].endswith("sampler_weights/step_3")
    metrics = step_metrics(run_dir)[2]["metrics"]
    assert metrics["logprobs/mean_training"] < 0 and metrics["train/learning_rate"] == 0.05
    if legacy:  # the 0.25 protocol has no session finish; the session expires without heartbeats
        assert not service.calls("finish_session")
    else:
        assert service.calls("finish_session"), "the trainer did not close its Tinker session"

    warnings = {entry["parameter"]: entry for entry in trainer_state(run_dir)["warnings"]}
    assert all(entry["code"] == "parameter_ignored" for entry in warnings.values())
    if legacy:  # read from the server's published schemas
        assert set(warnings) == LEGACY_IGNORED
        assert "True" in warnings["lora_config.train_unembed"]["message"]
    else:  # the current stand-in publishes no schemas, but returns no top-k logprobs either
        assert set(warnings) == {"topk_sample_logprobs"}
        assert "came back without them" in warnings["topk_sample_logprobs"]["message"]
    events = [line for line in metric_lines(run_dir) if line.get("event") == "warning"]
    assert {event["parameter"] for event in events} == set(warnings)


def test_a_step_sends_its_calls_before_waiting_for_results(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """The stand-in withholds the gradients until the optimiser step arrives: a backend that waits for the
    gradients before sending the step never finishes it; one that pipelines the step's calls does, and the
    weights it publishes are the stepped ones."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    service = LoopbackTinker(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, hold_gradients=True)
    with LoopbackServer(service, free_port()) as server:
        monkeypatch.setenv("TINKER_BASE_URL", server.url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-loopback")
        config = parse_config(
            {
                "env": {"rollout_server_url": "http://127.0.0.1:1", "tokenizer_name": str(tiny_model_dir)},
                "tinker": {
                    "backend": "tinker",
                    "base_model": "Qwen/Qwen3-8B",
                    "run_dir": str(tmp_path / "run"),
                    "inference_port": free_port(),  # unused: no inference server here
                    "loss_fn": "importance_sampling",
                },
            }
        )
        backend = TinkerBackend(config)
        try:
            backend.publish_weights(0)
            rng = random.Random(1)
            data = prepare_batch([scored_group(rng) for _ in range(2)], 1024).data
            outcomes: list[StepOutcome] = []
            stepping = threading.Thread(target=lambda: outcomes.append(backend.train_step(data, 0.05, 1)), daemon=True)
            stepping.start()
            stepping.join(timeout=60)  # a backend that does not pipeline would wait here forever
            assert outcomes, "the step did not finish: the optimiser step was not sent before the gradients came back"
            [outcome] = outcomes
            [model_id] = service.models
            trained = service.models[model_id].logits
            assert [name for name, _ in service.requests if name in TRAINING_CALLS] == [
                "save_weights_for_sampler",
                "forward_backward",
                "optim_step",
                "save_weights_for_sampler",
            ]
            assert len(outcome.result.logprobs) == len(data) and trained.any()
            assert outcome.published.version == 1
            assert (service.samplers[outcome.published.reference] == trained).all()
        finally:
            backend.close()
