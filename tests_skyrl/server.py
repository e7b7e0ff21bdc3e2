"""SkyRL's Tinker-compatible server (PyPI `skyrl`, JAX backend, CPU) on loopback, from .venv-skyrl.

How it is started, and why (docs/SKYRL.md): `skyrl.tinker.api` starts its engine as `uv run <the flags it was itself
started with> --extra tinker --extra jax -m skyrl.tinker.engine ...`, reading those flags from its parent's command
line, so it must itself be started by `uv run`. `--no-project --python <env python>` makes both runs use the
installed environment as it is (no project, nothing synced; uv only warns that `--extra` has no effect), and
`--offline` keeps uv off the network. The base model is served under exactly the name given as `--base-model`,
which clients must use as theirs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlctl.trainer.tiny_model import init_tiny_model
from tests.trainer.pipeline import REPO_ROOT, Process, child_environment, processes, wait_for, wait_http

API_KEY = "tml-skyrl-local"  # the SDK insists on the tml- prefix; SkyRL checks no key
ENGINE_READY = "Initialized TinkerEngine"  # logged once the engine has loaded the base model
START_TIMEOUT_S = 300.0


def skyrl_venv() -> Path:
    return Path(os.environ.get("RLCTL_SKYRL_VENV") or REPO_ROOT / ".venv-skyrl").resolve()


def server_argv(venv: Path, model_dir: Path, port: int, workdir: Path) -> list[str]:
    python = str(venv / "bin" / "python")
    uv = [str(venv / "bin" / "uv"), "run", "--no-project", "--offline", "--python", python]
    return [
        *uv,
        *("-m", "skyrl.tinker.api"),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--base-model", str(model_dir), "--backend", "jax"),
        *("--database-url", f"sqlite:///{workdir / 'tinker.db'}"),
        *("--checkpoints-base", str(workdir / "checkpoints")),
        *("--external-inference-lora-base", str(workdir / "lora")),
    ]


@dataclass(frozen=True)
class SkyRLServer:
    url: str
    model_dir: Path  # the base model's name on this server, and rlctl's tokenizer
    process: Process

    def client_environment(self, data_dir: Path, **extra: str) -> dict[str, str]:
        """The environment of an rlctl process that trains on this server."""
        return child_environment(data_dir, TINKER_BASE_URL=self.url, TINKER_API_KEY=API_KEY, **extra)


@contextmanager
def skyrl_server(workdir: Path, port: int) -> Iterator[SkyRLServer]:
    """A SkyRL server serving rlctl's tiny model, stopped (whole process group) on the way out."""
    venv = skyrl_venv()
    if not (venv / "bin" / "uv").exists():
        raise RuntimeError(f"no SkyRL environment at {venv}: `make install-skyrl` builds it")
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = init_tiny_model(workdir / "tiny-qwen3")
    environment = child_environment(
        workdir / "var",
        JAX_PLATFORMS="cpu",
        UV_CACHE_DIR=str(workdir / "uv-cache"),
        COLUMNS="250",  # unwrapped logs
    )
    with processes() as start:
        server = start("skyrl", server_argv(venv, model_dir, port, workdir), workdir / "skyrl.log", environment)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/api/v1/healthz", server, START_TIMEOUT_S)

        def engine_ready() -> bool:
            if not server.alive:
                raise AssertionError(f"SkyRL exited:\n{server.log_tail()}")
            return ENGINE_READY in server.log_text()

        wait_for(engine_ready, START_TIMEOUT_S, "SkyRL's engine to load the model", interval_s=0.5)
        yield SkyRLServer(url, model_dir, server)
