"""A run's inference server is reached by its run only: a per-run key (RLCTL_RUN_INFERENCE_KEY), bodies bounded,
and a caller's bad requests answered 400 without spending the run's failure budget.

Attacked before: any local process could sample, and 206 requests naming a token id past the vocabulary gave 502s
that ended the run `sampling_failed` in 0.46 s; an 8 MB prompt drove the trainer to 3.55 GB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlctl.service.runs.launch import ENV_HOOKS_DIR, Ports, process_specs
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import Settings
from rlctl.supervisor.run import API, ENV, TRAINER
from rlctl.trainer.backends.local import LocalBackend
from rlctl.trainer.failures import SAMPLING_FAILED, FailureBudget
from rlctl.trainer.inference_guard import KEY_ENV, MAX_BODY_BYTES
from rlctl.trainer.inference_server import InferenceServer, create_app
from tests.support.endpoints import cpu_backend
from tests.support.live import free_port
from tests.support.tiny_model import session_tiny_model
from tests.support.waiting import REQUEST_TIMEOUT, scaled

KEY = "run-inference-key-for-this-test-0123456789"
BUDGET = 5  # consecutive failures that would end the run


@dataclass
class Served:
    url: str
    backend: LocalBackend
    budget: FailureBudget

    def client(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=REQUEST_TIMEOUT)


@pytest.fixture(scope="module")
def tiny_model_dir() -> Path:
    return session_tiny_model()


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    backend = cpu_backend(tiny_model_dir, tmp_path_factory.mktemp("run"), port)
    backend.publish_weights(1)
    budget = FailureBudget(SAMPLING_FAILED, BUDGET, "sampling")
    server = InferenceServer(create_app(backend, sampling_budget=budget, api_key=KEY), "127.0.0.1", port)
    server.start()
    try:
        yield Served(f"http://127.0.0.1:{port}", backend, budget)
    finally:
        server.stop()
        backend.close()


def test_an_outsider_without_the_key_gets_401(served: Served) -> None:
    prompt = served.backend.tokenizer.encode("Echo: 1")
    for key in (None, "wrong-key", KEY + "x"):
        with served.client(key) as outsider:
            for method, path, body in (
                ("POST", "/generate", {"input_ids": prompt}),
                ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                ("GET", "/v1/models", None),
            ):
                answer = outsider.request(method, path, json=body)
                assert answer.status_code == 401, (key, path, answer.text)
                assert answer.json()["error"]["code"] == "invalid_api_key"
            assert outsider.get("/health").status_code == 200  # the supervisor's probe carries no key
    assert httpx.get(f"{served.url}/health", timeout=REQUEST_TIMEOUT).json()["served"] == {}


def test_206_bad_requests_do_not_spend_the_failure_budget(served: Served) -> None:
    vocabulary = len(served.backend.tokenizer)
    with served.client() as run:
        for attempt in range(206):
            bad = [1, vocabulary + attempt] if attempt % 2 else [-1 - attempt]
            answer = run.post("/generate", json={"input_ids": bad, "sampling_params": {"max_new_tokens": 2}})
            assert answer.status_code == 400, answer.text
            assert "outside the vocabulary" in answer.json()["error"]["message"]
        completions = run.post("/v1/completions", json={"prompt": [vocabulary + 5], "max_tokens": 2})
        assert completions.status_code == 400
        state = served.budget.state()
        assert (state.consecutive, state.total) == (0, 0), state
        good = run.post("/generate", json={"input_ids": served.backend.tokenizer.encode("Echo: 3")})
        assert good.status_code == 200 and "meta_info" in good.json()


def test_request_bodies_are_bounded(served: Served) -> None:
    huge = {"prompt": "x" * (MAX_BODY_BYTES + 1), "max_tokens": 1}
    with served.client() as run:
        declared = run.post("/v1/completions", json=huge)
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(5):
                yield b"y" * (1 << 20)

        streamed = run.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413
    assert served.budget.state().total == 0


def test_each_launch_gives_its_trainer_and_environment_one_fresh_key(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "var")
    paths = RunPaths(settings.data_path, "run-1")
    environment_file = tmp_path / "env.py"

    def keys() -> dict[str, str | None]:
        specs = process_specs(settings, paths, Ports(1, 2), environment_file, "local")
        return {spec.role: spec.env.get(KEY_ENV) for spec in specs}

    first, second = keys(), keys()
    assert first[API] is None  # the Atropos API never samples
    assert first[TRAINER] == first[ENV] and len(first[TRAINER] or "") >= 32
    assert second[TRAINER] != first[TRAINER]


def test_the_environment_process_samples_with_the_key(served: Served, tmp_path: Path) -> None:
    """The environment hook gives atroposlib's client the key in place of the config's placeholder: a real
    process with the hook on its PYTHONPATH samples through the guarded server."""
    script = f"""
import asyncio, json
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
config = APIServerConfig(model_name={served.backend.model_name!r}, base_url={served.url + "/v1"!r},
                         api_key="local", server_type="sglang", health_check=False)
manager = ServerManager([config])
server = manager.servers[0]
tokens, outputs, _, _ = asyncio.run(server.tokens_and_logprobs_completion(prompt="Echo: 5", n=1, max_tokens=2))
print(json.dumps({{"outputs": len(outputs), "placeholder_kept": server.config.api_key == "local"}}))
"""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ENV_HOOKS_DIR), os.environ.get("PYTHONPATH", "")]),
        "RLCTL_ENV_METRICS_PATH": str(tmp_path / "env_metrics.jsonl"),
        KEY_ENV: KEY,
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"outputs": 1, "placeholder_kept": False}
    assert KEY not in done.stdout + done.stderr
