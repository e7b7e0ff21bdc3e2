"""How a run's processes are started: commands, environments, readiness probes, ports."""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlctl.judging.client import JUDGE_KEY_ENV
from rlctl.service.children import service_child_environment
from rlctl.service.rewards.judge import judge_endpoint
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.wandb import WandbMode, wandb_environment
from rlctl.service.settings import REPO_ROOT, Settings
from rlctl.supervisor.process import ProcessSpec
from rlctl.supervisor.readiness import atropos_env_registered, http_answers
from rlctl.supervisor.run import API, ENV, TRAINER
from rlctl.trainer.inference_guard import KEY_ENV as INFERENCE_KEY_ENV

ENV_HOOKS_DIR = REPO_ROOT / "rlctl" / "supervisor" / "envhooks"


@dataclass(frozen=True)
class Ports:
    api: int
    inference: int

    def to_dict(self) -> dict[str, int]:
        return {"api": self.api, "inference": self.inference}


def process_specs(
    settings: Settings,
    paths: RunPaths,
    ports: Ports,
    environment_file: Path,
    backend: str,
    wandb_mode: WandbMode = WandbMode.DISABLED,
    members: list[tuple[Path, Path, str]] | None = None,
) -> list[ProcessSpec]:
    """The three processes, all spawned at once (docs/RUNS.md#process-order): the trainer waits for the API
    itself, and the environment's registration waits for it (the environment hook); the environment registers
    only once the trainer has (Atropos answers it "wait for trainer to start" until then). A mixed run's `env`
    process runs one environment process per member (rlctl/supervisor/mixture.py), ready once all registered."""
    api_url = f"http://127.0.0.1:{ports.api}"
    config = str(paths.config)
    # The run's inference server answers only its environment (and its trainer): a key made now, in these two
    # processes' environments only, never in a file, a log line or the database (docs/SECURITY.md).
    inference_key = {INFERENCE_KEY_ENV: secrets.token_urlsafe(32)}
    return [
        ProcessSpec(
            role=API,
            argv=[sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(ports.api)],
            env=_base_environment(),
            cwd=paths.run_dir,
            log_path=paths.log(API),
            ready=http_answers(f"{api_url}/"),
            ready_timeout_s=settings.api_ready_timeout_s,
            after=(),
        ),
        ProcessSpec(
            role=TRAINER,
            argv=[sys.executable, "-m", "rlctl.trainer", "--config", config],
            env={**trainer_environment(settings, backend, wandb_mode), **inference_key},
            cwd=REPO_ROOT,
            log_path=paths.log(TRAINER),
            ready=http_answers(f"http://127.0.0.1:{ports.inference}/health"),
            ready_timeout_s=settings.trainer_ready_timeout_s,
            after=(),
        ),
        ProcessSpec(
            role=ENV,
            argv=_environment_argv(environment_file, config, members),
            env={**environment_environment(settings, paths, wandb_mode), **inference_key},
            cwd=paths.run_dir,
            log_path=paths.log(ENV),
            ready=atropos_env_registered(api_url, len(members) if members else 1),
            ready_timeout_s=settings.env_ready_timeout_s,
            after=(),
            probe_after=(TRAINER,),  # it registers only after the trainer has
        ),
    ]


def _environment_argv(environment_file: Path, config: str, members: list[tuple[Path, Path, str]] | None) -> list[str]:
    if not members:
        return [sys.executable, str(environment_file), "serve", "--config", config]
    argv = [sys.executable, "-m", "rlctl.supervisor.mixture"]
    for file, member_config, prefix in members:
        argv += ["--member", str(file), str(member_config), prefix]
    return argv


def trainer_environment(settings: Settings, backend: str, wandb_mode: WandbMode) -> dict[str, str]:
    """Secrets reach the trainer through its environment only, never a file."""
    env = _base_environment()
    env["RLCTL_DATA_DIR"] = str(settings.data_path)
    env.update(tinker_environment(settings, backend))
    env.update(wandb_environment(settings, wandb_mode))
    return env


def tinker_environment(settings: Settings, backend: str) -> dict[str, str]:
    """Where Tinker is, and its key for a child of the tinker backend only (a trainer, an evaluation's sampler):
    in the child's environment, never a file."""
    env: dict[str, str] = {}
    if backend == "tinker" and settings.tinker_api_key:
        env["TINKER_API_KEY"] = settings.tinker_api_key.get_secret_value()
    if settings.tinker_base_url:
        env["TINKER_BASE_URL"] = settings.tinker_base_url
    return env


def environment_environment(settings: Settings, paths: RunPaths, wandb_mode: WandbMode) -> dict[str, str]:
    env = _base_environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENV_HOOKS_DIR), env.get("PYTHONPATH", "")]))
    env["RLCTL_ENV_METRICS_PATH"] = str(paths.env_metrics)
    # It starts beside the API: its registration waits this long for the API to answer (envhooks).
    env["RLCTL_ENV_API_WAIT_S"] = f"{settings.api_ready_timeout_s:g}"
    if (key := judge_key(settings, paths)) is not None:
        env[JUDGE_KEY_ENV] = key
    if settings.gsm8k_path:
        env["RLCTL_GSM8K_PATH"] = str(Path(settings.gsm8k_path).expanduser().resolve())
    env.update(wandb_environment(settings, wandb_mode))
    return env


def judge_key(settings: Settings, paths: RunPaths) -> str | None:
    """The judge's key for a run whose environment asks the judge (its YAML names `dataset_judge`, an online dataset
    run's, or `judge`, a tool environment's with a rubric; never the key): it reaches the environment process in its
    environment only, read from the settings at each start."""
    try:
        merged = yaml.safe_load(paths.config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    envs = [merged.get("env") or {}, *(member.get("env") or {} for member in merged.get("mixture") or [])]
    if not any(env.get("dataset_judge") or env.get("judge") for env in envs):  # a mixture's environments too
        return None
    endpoint = judge_endpoint(settings)
    return endpoint[1] if endpoint else None


def _base_environment() -> dict[str, str]:
    env = service_child_environment()
    env["PYTHONUNBUFFERED"] = "1"
    return env
