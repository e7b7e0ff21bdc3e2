"""`rlctl model serve` as a real process on a loopback port, and the echo collection that asks it for answers:
the collected-trajectories proof (tests/runs/test_collected_loop.py), the model-serve test and
benchmarks/dataset_loop.py run the same ones."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from rlctl.service.children import process_fork_server
from rlctl.supervisor.ports import free_ports
from rlctl.supervisor.process import ProcessSpec, SupervisedProcess
from tests.support.waiting import scaled, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def served_model(*argv: str, timeout: float = 120) -> Iterator[str]:
    """`rlctl model serve ARGV...`, until it answers /health; yields its base URL, and stops its process group.
    Forked from this process's fork server, as the service's children are (its imports are paid once)."""
    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="rlctl-served-model-") as scratch:
        spec = ProcessSpec(
            role="model-server",
            argv=[sys.executable, "-m", "rlctl.service.cli", "model", "serve", *argv, "--port", str(port)],
            env=dict(os.environ),
            cwd=REPO_ROOT,
            log_path=Path(scratch) / "model-server.log",
        )
        process = SupervisedProcess.spawn(spec, process_fork_server())
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _healthy(base_url, process), timeout=timeout, message="model served")
            yield base_url
        finally:
            process.terminate(grace_s=scaled(30))


def _healthy(base_url: str, process: SupervisedProcess) -> bool:
    if (ended := process.poll()) is not None:
        raise RuntimeError(f"the model server {ended.describe()}: {process.log_path.read_text()[-2000:]}")
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def echo_prompts(count: int) -> list[dict[str, Any]]:
    digits = [f"{(7919 * (p + 11)) % 10000:04d}" for p in range(count)]
    return [{"prompt": f"Echo: {d}", "answer": d} for d in digits]


def echo_collection(base_url: str, model_dir: Path, prompts: int, samples: int) -> dict[str, Any]:
    """POST /collections' body: `samples` one-turn answers of the served model to each of `prompts` echo prompts."""
    return {
        "name": "echo-collected",
        "prompts": echo_prompts(prompts),
        "base_url": f"{base_url}/v1",
        "model": str(model_dir),
        "runs_per_prompt": samples,
        "concurrency": 4,
        "max_turns": 1,
        "max_tokens": 8,
        "tools": [],
        "discard_without_reasoning": False,  # the tiny model never reasons
    }
