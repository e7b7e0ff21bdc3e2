"""Helpers for tests that run the real pipeline processes: ports, process groups, run YAMLs, waits."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from rlctl.service.children import process_fork_server
from rlctl.service.runs.launch import ENV_HOOKS_DIR
from rlctl.supervisor.envhooks.sitecustomize import trainer_registered
from rlctl.supervisor.process import ProcessSpec, SupervisedProcess
from tests.support.live import free_port
from tests.support.waiting import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("TINKER_API_KEY", "WANDB_API_KEY", "OPENROUTER_API_KEY", "RLCTL_API_TOKEN")


ENV_METRICS = "env_metrics.jsonl"


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy; fail with `what` after the (scaled) deadline."""
    timeout_s = scaled(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def child_environment(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment for pipeline processes: no secrets of the developer's shell, no network downloads."""
    environment = {key: value for key, value in os.environ.items() if key not in SECRETS}
    environment.update(
        RLCTL_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        WANDB_SILENT="true",
    )
    environment.pop("WANDB_MODE", None)
    environment.update(extra)
    return environment


class Process:
    """A child in its own process group, logging to a file; `stop` ends the whole group. Forked from this test
    process's fork server, as the service forks a run's processes (docs/RUNS.md#the-fork-server): the imports of
    torch, transformers and atroposlib are paid once per test worker, not once per process."""

    def __init__(self, name: str, argv: list[str], log_path: Path, environment: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        log_path.write_bytes(b"")
        spec = ProcessSpec(role=name, argv=argv, env=environment, cwd=REPO_ROOT, log_path=log_path)
        self.process = SupervisedProcess.spawn(spec, process_fork_server())

    @property
    def pid(self) -> int:
        return self.process.identity.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code, or minus the signal that ended it (as subprocess has it); None while it runs."""
        status = self.process.poll()
        if status is None:
            return None
        return -status.signal if status.signal is not None else status.code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + scaled(timeout_s)
        while (code := self.returncode) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} still running after {timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.05)
        return code

    def signal_group(self, signum: int) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the group, SIGKILL after the grace period; returns once no member is left."""
        self.process.terminate(grace_s=grace_s)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


@contextmanager
def processes() -> Iterator[Callable[..., Process]]:
    """Start processes with the yielded function; all of them are stopped, newest first, on the way out."""
    started: list[Process] = []

    def start(name: str, argv: list[str], log_path: Path, environment: dict[str, str]) -> Process:
        process = Process(name, argv, log_path, environment)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in reversed(started):
            process.stop()


def still_running(process: Process) -> None:
    """Fails a wait at once, with the log's tail, when what it waits for has exited."""
    if not process.alive:
        raise AssertionError(f"{process.name} exited ({process.returncode}):\n{process.log_tail()}")


def wait_http(url: str, process: Process, timeout_s: float) -> None:
    def answers() -> bool:
        still_running(process)
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout_s, f"{url} to answer")


def wait_registered(api_url: str, trainer: Process, timeout_s: float) -> None:
    """Until the trainer has registered with the Atropos API at `api_url`. Groups posted before that are queued,
    and atroposlib then skips the set-up of the registration (it makes its queue on either): the trainer would
    never get a batch. An environment registers only after the trainer; a test posting groups itself waits."""

    def registered() -> bool:
        still_running(trainer)
        return trainer_registered(api_url)

    wait_for(registered, timeout_s, f"{trainer.name} to register with the API")


def start_api(start: Callable[..., Process], run_dir: Path, port: int, environment: dict[str, str]) -> Process:
    api = start(
        "run-api",
        [sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)],
        run_dir / "api.log",
        environment,
    )
    wait_http(f"http://127.0.0.1:{port}/status", api, 60)
    return api


def start_trainer(
    start: Callable[..., Process], config_path: Path, environment: dict[str, str], name: str = "trainer"
) -> Process:
    return start(
        name,
        [sys.executable, "-m", "rlctl.trainer", "--config", str(config_path)],
        config_path.parent / f"{name}.log",
        environment,
    )


def start_environment(
    start: Callable[..., Process], env_file: str, config_path: Path, environment: dict[str, str]
) -> Process:
    return start(
        "environment",
        [sys.executable, str(REPO_ROOT / "environments" / env_file), "serve", "--config", str(config_path)],
        config_path.parent / "env.log",
        environment,
    )


def write_run_yaml(
    run_dir: Path,
    *,
    model_dir: Path,
    api_port: int,
    inference_port: int,
    total_steps: int,
    env: dict[str, Any] | None = None,
    tinker: dict[str, Any] | None = None,
    group_size: int = 8,
    batch_size: int = 32,
) -> Path:
    """The merged run YAML, in the layout of docs/RUNS.md#the-merged-run-yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "env": {
            "tokenizer_name": str(model_dir),
            "rollout_server_url": f"http://127.0.0.1:{api_port}",
            "group_size": group_size,
            "batch_size": batch_size,
            "total_steps": total_steps,
            "max_token_length": 512,
            "wandb_name": run_dir.name,
            "use_wandb": False,
            "max_batches_offpolicy": 3,
            **(env or {}),
        },
        "openai": [
            {
                "model_name": str(model_dir),
                "base_url": f"http://127.0.0.1:{inference_port}/v1",
                "api_key": "local",
                "server_type": "sglang",
                "health_check": False,
            }
        ],
        "tinker": {
            "backend": "local",
            "base_model": str(model_dir),
            "lora_rank": 8,
            "learning_rate": 0.01,
            "total_steps": total_steps,
            "batch_size": batch_size,
            "group_size": group_size,
            "max_token_trainer_length": 1024,
            "save_checkpoint_interval": 10,
            "inference_host": "127.0.0.1",
            "inference_port": inference_port,
            "run_dir": str(run_dir),
            "wandb_project": "rlctl-tests",
            "wandb_run_name": run_dir.name,
            "seed": 0,
            **(tinker or {}),
        },
        "slurm": False,
        "testing": False,
    }
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def metric_lines(run_dir: Path) -> list[dict[str, Any]]:
    """Whole lines of metrics.jsonl; a trailing partial line is ignored, as the contract says."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def step_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [record for record in metric_lines(run_dir) if "step" in record and "metrics" in record]


def trainer_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "trainer_state.json"
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass(frozen=True)
class PipelineRun:
    """A run that has ended: the trainer's exit code and process (its log stays readable), and the environment's
    log as it was when the trainer exited (before the environment was stopped)."""

    exit_code: int
    trainer: Process
    environment_log: str


# A tool environment's run in these tests: a conversation fits 1024 tokens, no evaluation, one batch ahead at most
# (rollouts of the policy being trained, not of one three steps old).
TOOL_RUN_ENV = {
    "max_token_length": 1024,
    "max_turns": 3,
    "eval_items": 0,
    "steps_per_eval": 1000,
    "seed": 0,
    "max_batches_offpolicy": 1,
}


def run_pipeline(
    run_dir: Path,
    *,
    model_dir: Path,
    total_steps: int,
    environment: dict[str, str],
    timeout_s: float,
    start_timeout_s: float = 90,
    environment_file: str = "echo.py",
    group_size: int = 8,
    batch_size: int = 32,
    env: dict[str, Any] | None = None,
    tinker: dict[str, Any] | None = None,
) -> PipelineRun:
    """`run-api`, the trainer (on the local backend unless `tinker` says otherwise) and
    `environments/{environment_file}`, wired by one run YAML, until the trainer exits (within `timeout_s`); every
    process is stopped on the way out."""
    api_port, inference_port = free_port(), free_port()
    config = write_run_yaml(
        run_dir,
        model_dir=model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=total_steps,
        group_size=group_size,
        batch_size=batch_size,
        env=env,
        tinker=tinker,
    )
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_http(f"http://127.0.0.1:{inference_port}/health", trainer, start_timeout_s)
        served = start_environment(start, environment_file, config, environment)
        exit_code = trainer.wait(timeout_s)
        environment_log = served.log_text()
    return PipelineRun(exit_code, trainer, environment_log)


def metrics_environment(data_dir: Path, run_dir: Path, **extra: str) -> dict[str, str]:
    """A child environment in which the environment's metrics go where a supervised run's go (the hook rlctl puts
    on its PYTHONPATH): `env_metrics_of(run_dir)` reads them."""
    hooks = f"{ENV_HOOKS_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return child_environment(data_dir, PYTHONPATH=hooks, RLCTL_ENV_METRICS_PATH=str(run_dir / ENV_METRICS), **extra)


def env_metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    """The metric records the environment logged (`metrics_environment`), oldest first."""
    path = run_dir / ENV_METRICS
    return [json.loads(line)["metrics"] for line in path.read_text().splitlines()] if path.exists() else []
