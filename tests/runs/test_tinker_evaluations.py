"""Evaluations of a `tinker` run (docs/EVALUATIONS.md#sampling): the sampler child samples the base model and the
checkpoint's saved sampler weights (`tinker://…`) through the real `tinker` SDK, with the Tinker key in its
environment only, and the service scores each model's samples of a prompt as one judge group.

Tinker and the judge model are paid remote services this machine cannot reach, so each is a loopback server
speaking its real protocol: tests/trainer/tinker_loopback.py (a unigram model behind the Tinker protocol) and the
chat server of the dataset tests, scoring by the rule of tests/datasets_api/test_judge_api.py (an answer that says
5 scores 0.9, else 0.1). No run trains: the checkpoint is saved through the trainer's own Tinker backend onto the
stand-in, whose model is first set to answer 5, so the checkpoint must beat the (untrained, uniform) base model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlctl.service.settings import Settings
from rlctl.trainer.backends.tinker_backend import TinkerBackend
from rlctl.trainer.config import parse_config
from rlctl.trainer.tiny_model import build_tokenizer
from tests.datasets_api.chat_server import chat_server
from tests.datasets_api.test_judge_api import TRAJECTORY, rule_judge
from tests.runs.test_evaluation_judge import evaluable_run
from tests.support.live import free_port, in_process_service
from tests.support.waiting import wait_until
from tests.trainer.tinker_loopback import LoopbackServer, LoopbackTinker

TINKER_KEY = "tml-eval-tinker-secret-4471"  # the SDK insists on the tml- prefix; the stand-in records each key
SETUP_KEY = "tml-test-setup"  # the key this test saves the checkpoint with, so the service's own is told apart
JUDGE_KEY = "sk-eval-judge-3318"
BASE_MODEL = "Qwen/Qwen3-8B"


def saved_checkpoint(
    loopback: LoopbackTinker, url: str, tokenizer_dir: Path, five: int, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """A checkpoint as the trainer records it (`save_checkpoint`), of a model the stand-in makes answer 5."""
    with monkeypatch.context() as patched:
        patched.setenv("TINKER_BASE_URL", url)
        patched.setenv("TINKER_API_KEY", SETUP_KEY)
        config = parse_config(
            {
                "env": {"rollout_server_url": "http://127.0.0.1:1", "tokenizer_name": str(tokenizer_dir)},
                "tinker": {
                    "backend": "tinker",
                    "base_model": BASE_MODEL,
                    "run_dir": str(tokenizer_dir.parent / "setup"),
                    "inference_port": free_port(),  # unused: no inference server here
                },
            }
        )
        backend = TinkerBackend(config)
        try:
            [model_id] = loopback.models
            loopback.models[model_id].logits[five] = 30.0  # what training would have done, at once
            return backend.save_checkpoint(2).as_record()
        finally:
            backend.close()


@pytest.mark.e2e
def test_a_tinker_checkpoint_is_sampled_from_its_saved_weights_and_judged(
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    tokenizer = build_tokenizer()
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    loopback = LoopbackTinker(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    with LoopbackServer(loopback, free_port()) as tinker_server, chat_server(rule_judge) as judge:
        five = tokenizer.convert_tokens_to_ids("5")
        checkpoint = saved_checkpoint(loopback, tinker_server.url, tokenizer_dir, five, monkeypatch)
        settings = make_settings(
            TINKER_API_KEY=TINKER_KEY,
            TINKER_BASE_URL=tinker_server.url,
            judge_base_url=judge.base_url,
            judge_api_key=JUDGE_KEY,
            judge_model="rule-judge",
        )
        config = {"tinker": {"base_model": BASE_MODEL}, "env": {"tokenizer_name": str(tokenizer_dir)}}
        run_id = evaluable_run(settings, [checkpoint], backend="tinker", config=config)
        with in_process_service(settings) as live, live.client() as client:
            body = {"run_id": run_id, "rewards": [{"name": "judge"}], "samples_per_prompt": 4, "max_tokens": 1}
            response = client.post("/evaluations", json=body)
            assert response.status_code == 202, response.text

            def ended() -> dict[str, Any] | None:
                current = client.get(f"/evaluations/{response.json()['id']}").json()
                return current if current["status"] in ("succeeded", "failed", "cancelled") else None

            done = wait_until(ended, timeout=120, message="the tinker evaluation ends")
            texts = [response.text, json.dumps(done), client.get(f"/jobs/{done['id']}").text]

    assert done["status"] == "succeeded", done["error"]
    base, trained = done["models"]
    assert (base["name"], base["weights"]) == ("base", None)
    assert (trained["name"], trained["weights"]) == ("step_2", checkpoint["weights"])
    assert checkpoint["weights"].startswith("tinker://") and checkpoint["weights"].endswith("sampler_weights/step_2")
    assert (
        base["samples"] == trained["samples"] == 3 * 4 and base["unscored_prompts"] == trained["unscored_prompts"] == 0
    )
    assert trained["mean_reward"] == pytest.approx(0.9)  # it answers 5
    assert trained["interval"][0] > 0 and trained["win_rate"] == 1.0, done["models"]
    assert done["judge"]["groups"] == 6 and done["judge"]["failed_groups"] == 0

    # One sampling session of the base model, one of the saved sampler weights; every prompt asked of both with
    # the same seed; each model's samples of a prompt judged as one group of four.
    sessions = loopback.calls("create_sampling_session")
    assert [(s.get("base_model"), s.get("model_path")) for s in sessions] == [
        (BASE_MODEL, None),
        (None, checkpoint["weights"]),
    ]
    asked = loopback.calls("asample")
    sources = [loopback.sampler_sources[a["sampling_session_id"]] for a in asked]
    assert sources == [BASE_MODEL] * 3 + [checkpoint["weights"]] * 3
    assert all(a["num_samples"] == 4 and a["sampling_params"]["max_tokens"] == 1 for a in asked)
    seeds = [a["sampling_params"]["seed"] for a in asked]
    assert seeds[:3] == seeds[3:] and len(set(seeds)) == 3
    assert sorted(len(TRAJECTORY.findall(r["messages"][1]["content"])) for r in judge.requests) == [4] * 6

    # Each key reached its own host only: not the spec, the sampler's log, a response, a file or a log line.
    spec = json.loads((settings.data_path / "evaluations" / done["id"] / "spec.json").read_text())
    assert spec["backend"] == "tinker" and [m["weights"] for m in spec["models"]] == [None, checkpoint["weights"]]
    assert loopback.api_keys == {SETUP_KEY, TINKER_KEY}
    assert set(judge.authorizations) == {f"Bearer {JUDGE_KEY}"}
    files = [p.read_bytes() for p in settings.data_path.rglob("*") if p.is_file()]
    for key in (TINKER_KEY, JUDGE_KEY):
        assert all(key not in text for text in texts) and key not in caplog.text
        assert all(key.encode() not in data for data in files)
