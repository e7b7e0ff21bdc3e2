"""`rlctl model serve` as a real process on a loopback port, and the echo collection that asks it for answers:
the collected-trajectories proof (tests/runs/test_collected_loop.py), the model-serve test and
benchmarks/dataset_loop.py run the same ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from supervisor.ports import free_ports
from tests.support.waiting import wait_until


@contextmanager
def served_model(*argv: str, timeout: float = 120) -> Iterator[str]:
    """`rlctl model serve ARGV...`, until it answers /health; yields its base URL, and stops its process group."""
    port = free_ports(1)[0]
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "model", "serve", *argv, "--port", str(port)],
        stdout=subprocess.DEVNULL,  # never read: a pipe left unread would stall a chatty server once full
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base_url, process), timeout=timeout, message="model served")
        yield base_url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _healthy(base_url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"the model server exited with {process.returncode}")
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
