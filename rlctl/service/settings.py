"""Server settings: environment variables prefixed `RLCTL_`, or a `.env` file.

The locked run fields live here: the operator sets them, API callers only see them (docs/RUNS.md#locked-fields).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from functools import cache, cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlctl.sandbox.netgate import parse_allowed_ranges
from rlctl.trainer.defaults import LOCAL_DEFAULTS, TINKER_BASE_MODEL, TINKER_DEFAULTS
from rlctl.trainer.tiny_model import default_tiny_model_dir


class Backend(StrEnum):
    TINKER = "tinker"  # the Tinker service
    LOCAL = "local"  # torch + peft on this machine


@dataclass(frozen=True)
class BackendValues:
    """What a run on one backend is locked to, as configured: the operator's settings for that backend."""

    base_model: str
    max_token_length: int
    total_steps: int
    steps_per_eval: int
    lora_rank: int
    learning_rate: float
    max_token_trainer_length: int
    save_checkpoint_interval: int
    batch_size: int  # when the environment's config_init() sets none
    group_size: int  # likewise


REPO_ROOT = Path(__file__).resolve().parents[2]
BUILTIN_ENVIRONMENTS_DIR = REPO_ROOT / "environments"
# The one list of secret settings (fields of Settings): never written to a file, a log line, the database or a
# response; every child's environment is scrubbed of their variables (SECRET_ENV_NAMES), and every text the service
# answers or logs of their values (`Settings.secret_values`, observability.Scrubber). A test fails on a SecretStr
# field missing here.
SECRET_SETTINGS = (
    "api_token",
    "tinker_api_key",
    "wandb_api_key",
    "openrouter_api_key",
    "summary_api_key",
    "judge_api_key",
    "collection_api_key",
    "inference_api_key",
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLCTL_", env_file=".env", env_file_encoding="utf-8", extra="ignore")

    # --- service ---
    data_dir: Path = Field(Path("./var"), description="Where the database, runs and logs live.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite in the data dir.")
    api_token: SecretStr | None = Field(None, description="Bearer token with every scope (admin).")
    tokens_file: Path | None = Field(
        None, description="Scoped tokens (names, scopes, hashes); default tokens.json in the data dir."
    )
    environment_dirs: str = Field("", description="Extra environment directories, ':'-separated.")
    status_check_interval_s: float = Field(1800, ge=0, description="Minimum time between live status checks.")
    gsm8k_path: Path | None = Field(None, description="Directory with GSM8K train.jsonl and test.jsonl.")
    schema_timeout_s: float = Field(90, gt=0, description="Time-out for importing an environment.")
    warm_up: bool = Field(
        True,
        description="At start-up, read every environment's config schema and build the local backend's tiny model "
        "in the background, each in a child process (docs/RUNS.md#start-up-work).",
    )
    fork_server: bool = Field(
        True,
        description="Fork local runs' processes and the service's own children from one parent that has imported "
        "torch, transformers and atroposlib once, instead of starting each as a fresh interpreter "
        "(docs/RUNS.md#the-fork-server).",
    )
    max_body_bytes: int = Field(1 << 20, gt=0, description="Largest JSON request body accepted.")
    max_caller_body_bytes: int = Field(
        64 << 20,
        gt=0,
        description="Request-body bytes one caller (a token, or an address on the open routes) may have in flight "
        "at once over all its requests held in memory; uploads stream to disk outside it "
        "(docs/SECURITY.md#authentication-before-the-body).",
    )
    job_workers: int = Field(2, ge=1, le=64, description="Background jobs run at once.")
    probe_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of the probe listener: /healthz and /readyz answered by a process of their own, never "
        "queued behind requests on the event loop (docs/ARCHITECTURE.md#probes); 0 picks a free port; none: off.",
    )
    probe_host: str = Field("127.0.0.1", description="Address the probe listener binds (0.0.0.0 for a cluster).")
    probe_stall_s: float = Field(
        10.0, gt=0, description="The probe listener's /healthz is 503 once the event loop has not run this long."
    )
    mcp_sessions_per_token: int = Field(
        32,
        ge=1,
        le=10_000,
        description="Open MCP sessions (handshake-era clients) per token: a new one ends the token's least recently "
        "used idle session; with every one busy it is refused (429 MCP_SESSION_QUOTA).",
    )
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    default_backend: Backend | None = Field(
        None, description="Backend of a run that does not name one; tinker when a Tinker key is set."
    )

    # --- supervision of runs ---
    api_ready_timeout_s: float = Field(60, gt=0, description="Time for the Atropos API to answer.")
    trainer_ready_timeout_s: float = Field(900, gt=0, description="Time for the trainer's inference server.")
    env_ready_timeout_s: float = Field(600, gt=0, description="Time for the environment to register.")
    stop_grace_s: float = Field(15, ge=0, description="SIGTERM to SIGKILL grace period per process.")
    stall_after_s: float = Field(1800, gt=0, description="A run with no new training step for this long is stalled.")
    drain_timeout_s: float = Field(900, gt=0, description="Time the trainer has to finish once the env is done.")
    monitor_interval_s: float = Field(1.0, gt=0, description="How often live runs are polled.")
    heartbeat_interval_s: float = Field(10, gt=0, description="How often this replica marks its runs alive.")
    replica_stale_after_s: float = Field(120, gt=0, description="A replica silent this long has died.")
    replica_id: str | None = Field(None, description="This replica's id; default: host name + data dir.")
    # --- where runs run, and how many at once (docs/RUNS.md#executors, docs/RUNS.md#admission) ---
    executor: Literal["local", "ray"] = Field(
        "local", description="local: the runs' processes are children of this host; ray: each run is a Ray job."
    )
    ray_address: str | None = Field(None, description="The Ray cluster's address, for RLCTL_EXECUTOR=ray.")
    max_concurrent_runs: int | None = Field(
        None, ge=1, description="local: runs started at once at most; more wait `queued`. Unset: no limit."
    )
    # --- runs on Ray (RLCTL_EXECUTOR=ray, docs/RAY.md) ---
    ray_control_url: str | None = Field(
        None, description="This control plane's URL as the Ray nodes reach it (the node-side supervisors report there)."
    )
    ray_node_python: str = Field("python", description="The Python on the Ray nodes that has rlctl installed.")
    ray_report_interval_s: float = Field(1.0, gt=0, description="How often a run's node reports logs and metrics.")
    wandb_check_timeout_s: float = Field(5, gt=0, description="Time W&B has to answer the key check of a new run.")
    wandb_base_url: str | None = Field(
        None, validation_alias=AliasChoices("WANDB_BASE_URL", "RLCTL_WANDB_BASE_URL"), description="W&B server."
    )

    # --- secrets read from their conventional names (never stored, never returned) ---
    tinker_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("TINKER_API_KEY", "RLCTL_TINKER_API_KEY")
    )
    tinker_base_url: str | None = Field(None, validation_alias=AliasChoices("TINKER_BASE_URL", "RLCTL_TINKER_BASE_URL"))
    wandb_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("WANDB_API_KEY", "RLCTL_WANDB_API_KEY"))
    openrouter_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENROUTER_API_KEY", "RLCTL_OPENROUTER_API_KEY")
    )

    # --- trajectory datasets and collections ---
    dataset_upload_max_bytes: int = Field(4 << 30, gt=0, description="Largest dataset upload (streamed to disk).")
    collection_max_body_bytes: int = Field(16 << 20, gt=0, description="Largest POST /collections body (prompts).")
    collection_max_bytes: int = Field(4 << 30, gt=0, description="Kept trajectories of one collection at most.")
    dataset_tokenizer: str | None = Field(
        None, description="Default token counter by name; else the run tokenizer when cached locally, else approx."
    )
    tokenizer_dirs: str = Field("", description="Directories whose subdirectories are tokenizers, ':'-separated.")
    summary_base_url: str | None = Field(
        None, description="OpenAI-compatible summariser; OpenRouter when only OPENROUTER_API_KEY is set."
    )
    summary_model: str = Field("google/gemini-3-flash-preview", description="Summariser model.")
    summary_api_key: SecretStr | None = Field(None, description="Summariser key; else OPENROUTER_API_KEY.")
    summary_timeout_s: float = Field(120, gt=0, description="Time-out per record, retries included.")
    summary_max_retries: int = Field(3, ge=0, le=10)
    summary_concurrency: int = Field(4, ge=1, le=64, description="Records summarised at once.")
    judge_base_url: str | None = Field(
        None, description="OpenAI-compatible judge (docs/TRAJECTORIES.md#judge); OpenRouter when only its key is set."
    )
    judge_model: str = Field("openai/o4-mini", max_length=256, description="Default judge model.")
    judge_api_key: SecretStr | None = Field(None, description="The key of judge_base_url, sent only there.")
    judge_timeout_s: float = Field(120, gt=0, description="Time-out per group, retries included.")
    judge_max_retries: int = Field(2, ge=0, le=10)
    judge_concurrency: int = Field(4, ge=1, le=64, description="Groups judged at once.")
    collection_api_key: SecretStr | None = Field(None, description="Key sent to collection chat endpoints.")
    collection_key_hosts: str = Field(
        "openrouter.ai", description="Hosts (':'-separated) that may receive the collection or OpenRouter key."
    )
    sandbox_bwrap: str = Field("bwrap", description="The sandbox program of the terminal tool (docs/SECURITY.md).")
    sandbox_uid: int = Field(
        65534, ge=1, le=(1 << 31) - 2, description="Unprivileged user of sandboxed commands when the service is root."
    )
    sandbox_network_allow: str = Field(
        "",
        description="Address ranges (CIDR, comma-separated, e.g. 127.0.0.1/32) that collections' sandboxes may "
        "reach though not public (loopback, private); cloud metadata addresses never (docs/SECURITY.md#network).",
    )
    sandbox_max_items: int = Field(
        16,
        ge=1,
        le=4096,
        description="Items with a sandbox running at once in the service, all collections "
        "together (docs/SECURITY.md#quotas).",
    )
    sandbox_memory_budget_bytes: int = Field(
        0,
        ge=0,
        description="Memory of all sandboxes together, and of one collection's; 0: half of the host's "
        "memory (docs/SECURITY.md#quotas).",
    )
    sandbox_collection_cpus: float = Field(
        0,
        ge=0,
        le=4096,
        description="CPU cores one collection's sandboxed calls may use together; 0: half of the "
        "host's cores, at least one (docs/SECURITY.md#quotas).",
    )
    # --- inference tests: a key goes to its own endpoint only (docs/INFERENCE_TESTS.md#keys) ---
    openrouter_base_url: str = Field(
        "https://openrouter.ai/api/v1", description="Default endpoint of inference tests; OPENROUTER_API_KEY's."
    )
    inference_base_url: str | None = Field(None, description="Another OpenAI-compatible endpoint with a key.")
    inference_api_key: SecretStr | None = Field(None, description="The key of inference_base_url.")
    inference_test_concurrency: int = Field(3, ge=1, le=32, description="Models of one inference test at once.")
    inference_test_timeout_s: float = Field(900, gt=0, description="Time one model of an inference test may take.")

    # --- locked run fields of the tinker backend (docs/RUNS.md#locked-fields; defaults: rlctl/trainer/defaults.py) ---
    tokenizer_name: str = TINKER_BASE_MODEL
    max_token_length: int = TINKER_DEFAULTS["max_token_length"]
    max_num_workers: int = 2048
    worker_timeout: float = 3600
    total_steps: int = TINKER_DEFAULTS["total_steps"]
    steps_per_eval: int = TINKER_DEFAULTS["steps_per_eval"]
    max_batches_offpolicy: int = 3
    inference_weight: float = 1.0
    eval_limit_ratio: float = 0.1
    lora_rank: int = TINKER_DEFAULTS["lora_rank"]
    learning_rate: float = TINKER_DEFAULTS["learning_rate"]
    max_token_trainer_length: int = TINKER_DEFAULTS["max_token_trainer_length"]
    save_checkpoint_interval: int = TINKER_DEFAULTS["save_checkpoint_interval"]

    # --- locked run fields of the local backend (tiny model on CPU: learns `echo` in minutes) ---
    local_base_model: str | None = Field(None, description="Model dir or cached id; default: the tiny model.")
    local_max_token_length: int = LOCAL_DEFAULTS["max_token_length"]
    local_total_steps: int = LOCAL_DEFAULTS["total_steps"]
    local_steps_per_eval: int = LOCAL_DEFAULTS["steps_per_eval"]
    local_lora_rank: int = LOCAL_DEFAULTS["lora_rank"]
    local_learning_rate: float = LOCAL_DEFAULTS["learning_rate"]
    local_max_token_trainer_length: int = LOCAL_DEFAULTS["max_token_trainer_length"]
    local_save_checkpoint_interval: int = LOCAL_DEFAULTS["save_checkpoint_interval"]
    # Sizes of a local run whose environment sets none in config_init() (Atropos class defaults otherwise).
    local_batch_size: int = LOCAL_DEFAULTS["batch_size"]
    local_group_size: int = LOCAL_DEFAULTS["group_size"]

    @field_validator("max_concurrent_runs", "ray_address", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """`RLCTL_MAX_CONCURRENT_RUNS=` means "no limit"."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_token", "tinker_api_key", "wandb_api_key", "openrouter_api_key", mode="before")
    @classmethod
    def _empty_secret_is_unset(cls, value: object) -> object:
        """`KEY=` in an env file means "not set", not a secret that is the empty string."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("sandbox_network_allow")
    @classmethod
    def _address_ranges(cls, value: str) -> str:
        parse_allowed_ranges(value)  # a ValueError names the bad range
        return value

    @cached_property
    def data_path(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def tokens_path(self) -> Path:
        return (self.tokens_file or self.data_path / "tokens.json").expanduser().resolve()

    @property
    def sqlalchemy_url(self) -> str:
        return normalize_database_url(self.database_url or f"sqlite:///{self.data_path / 'rlctl.db'}")

    @property
    def environment_directories(self) -> list[Path]:
        return [BUILTIN_ENVIRONMENTS_DIR, *_resolved_directories(self.environment_dirs), self.managed_environments_dir]

    @property
    def managed_environments_dir(self) -> Path:
        """Environments written through the API (docs/ENVIRONMENTS.md#writing-environments); scanned last."""
        return self.data_path / "environments"

    @property
    def environment_versions_dir(self) -> Path:
        return self.data_path / "environment_versions"

    @property
    def tiny_model_dir(self) -> Path:
        return default_tiny_model_dir(self.data_path)

    @property
    def schema_store_dir(self) -> Path:
        """Environments' config schemas kept across restarts (docs/ENVIRONMENTS.md#config-schema)."""
        return self.data_path / "cache" / "environment_schemas"

    @property
    def effective_default_backend(self) -> Backend:
        if self.default_backend:
            return self.default_backend
        return Backend.TINKER if self.tinker_api_key else Backend.LOCAL

    def backend_values(self, backend: Backend) -> BackendValues:
        if backend == Backend.LOCAL:
            return BackendValues(
                base_model=self.local_base_model or str(self.tiny_model_dir),
                max_token_length=self.local_max_token_length,
                total_steps=self.local_total_steps,
                steps_per_eval=self.local_steps_per_eval,
                lora_rank=self.local_lora_rank,
                learning_rate=self.local_learning_rate,
                max_token_trainer_length=self.local_max_token_trainer_length,
                save_checkpoint_interval=self.local_save_checkpoint_interval,
                batch_size=self.local_batch_size,
                group_size=self.local_group_size,
            )
        return BackendValues(
            base_model=self.tokenizer_name,
            max_token_length=self.max_token_length,
            total_steps=self.total_steps,
            steps_per_eval=self.steps_per_eval,
            lora_rank=self.lora_rank,
            learning_rate=self.learning_rate,
            max_token_trainer_length=self.max_token_trainer_length,
            save_checkpoint_interval=self.save_checkpoint_interval,
            batch_size=TINKER_DEFAULTS["batch_size"],
            group_size=TINKER_DEFAULTS["group_size"],
        )

    @property
    def secret_values(self) -> list[str]:
        """Every configured secret, so log and response scrubbers can look for them."""
        values = (getattr(self, name) for name in SECRET_SETTINGS)
        return [value.get_secret_value() for value in values if value and value.get_secret_value()]


@cache
def _resolved_directories(setting: str) -> tuple[Path, ...]:
    """RLCTL_ENVIRONMENT_DIRS' directories, resolved once per value: every response asks for them (the roots its
    paths are shown relative to), and resolving costs system calls."""
    return tuple(Path(p).expanduser().resolve() for p in setting.split(os.pathsep) if p.strip())


def _secret_env_names() -> frozenset[str]:
    """The variables each secret setting is read from: its aliases, else RLCTL_ and its name."""
    names: set[str] = set()
    for field_name in SECRET_SETTINGS:
        alias = Settings.model_fields[field_name].validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias else []
        names.update(str(choice) for choice in choices)
        names.add(f"RLCTL_{field_name.upper()}")
    return frozenset(names)


SECRET_ENV_NAMES = _secret_env_names()


def normalize_database_url(url: str) -> str:
    """Accept plain `postgresql://` URLs and pick the installed driver (psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url
