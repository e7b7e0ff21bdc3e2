"""OpenAI-compatible endpoints on loopback for inference tests: the trainer's real inference server on the tiny
model, and a front server that puts faults in front of it (a model that never answers, one that answers garbage)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlctl.trainer.backends.local import LocalBackend
from rlctl.trainer.config import parse_config
from rlctl.trainer.inference_server import InferenceServer, create_app
from tests.support.live import free_port
from tests.support.waiting import wait_until

STALLED_MODEL = "faults/never-answers"
GARBLED_MODEL = "faults/answers-garbage"


def cpu_backend(model_dir: Path, run_dir: Path, inference_port: int) -> LocalBackend:
    """The local backend on `model_dir`, on the CPU, as the trainer would make it for an inference server on
    `inference_port` (no environment: its rollout URL is a closed port)."""
    config = parse_config(
        {
            "env": {"rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "base_model": str(model_dir),
                "run_dir": str(run_dir),
                "inference_port": inference_port,
                "device": "cpu",
            },
        }
    )
    return LocalBackend(config)


@contextmanager
def tiny_model_endpoint(model_dir: Path, run_dir: Path, model_names: Sequence[str]) -> Iterator[str]:
    """The trainer's inference server on the tiny model, answering to `model_names`; yields its `/v1` URL."""
    port = free_port()
    backend = cpu_backend(model_dir, run_dir, port)
    backend.publish_weights(0)
    server = InferenceServer(create_app(backend, model_names=model_names), "127.0.0.1", port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()
        backend.close()


def fault_app(upstream: str, delay_s: float = 0.0) -> FastAPI:
    """Chat completions: STALLED_MODEL waits until the client goes, GARBLED_MODEL gets a 200 that is no completion,
    every other model is passed to `upstream` unchanged, after `delay_s` (a remote endpoint's round trip)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("model") == STALLED_MODEL:
            while not await request.is_disconnected():
                await asyncio.sleep(0.1)
            return JSONResponse({}, status_code=499)
        if body.get("model") == GARBLED_MODEL:
            return JSONResponse({"unexpected": "not a completion"})
        await asyncio.sleep(delay_s)
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.post(f"{upstream}/chat/completions", json=body)
        return JSONResponse(answer.json(), status_code=answer.status_code)

    return app


@contextmanager
def fault_endpoint(upstream: str, delay_s: float = 0.0) -> Iterator[str]:
    port = free_port()
    app = fault_app(upstream, delay_s)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name=f"fault-endpoint-{port}", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=30, message="fault endpoint start-up")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
