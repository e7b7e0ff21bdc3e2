"""The environment catalog: what is in the environment directories now, and each one's config schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.environments.discovery import (
    DiscoveryError,
    EnvironmentInfo,
    FileScan,
    environment_files,
    resolve_environments,
    scan_source,
)
from service.errors import EnvironmentLoadFailed, EnvironmentNotFound
from service.names import validate_name

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class FieldSchema:
    name: str
    type: str
    default: Any
    description: str
    json_schema: dict[str, Any]
    set_by_init: bool = True  # config_init() gave this value explicitly (not the class default)


@dataclass(frozen=True)
class ConfigSchema:
    config_class: str
    fields: tuple[FieldSchema, ...]
    defs: dict[str, Any]

    def field(self, name: str) -> FieldSchema | None:
        return next((f for f in self.fields if f.name == name), None)


FileSignature = tuple[int, int, int]


class EnvironmentCatalog:
    """Re-scans on every listing (files are stat-ed; only changed ones are parsed again)."""

    def __init__(
        self,
        directories: Callable[[], list[Path]],
        schema_timeout_s: float,
        child_environment: Callable[[], Mapping[str, str]],
    ) -> None:
        self._directories = directories
        self._schema_timeout_s = schema_timeout_s
        self._child_environment = child_environment
        self._scans: dict[Path, tuple[FileSignature, FileScan]] = {}
        self._schemas: dict[tuple[Path, str, tuple[Any, ...]], ConfigSchema] = {}
        self._lock = threading.Lock()
        self._schema_locks: dict[Path, threading.Lock] = {}

    def discover(self) -> tuple[list[EnvironmentInfo], list[DiscoveryError]]:
        files = environment_files(self._directories())
        with self._lock:
            scans = [self._scan(path) for path in files]
            for stale in set(self._scans) - set(files):
                del self._scans[stale]
        return resolve_environments(scans)

    def scans(self) -> list[FileScan]:
        """Every environment file as read now (cached by signature), for checks that need the whole picture."""
        files = environment_files(self._directories())
        with self._lock:
            return [self._scan(path) for path in files]

    def introspect(self, env: EnvironmentInfo) -> ConfigSchema:
        """Import the environment in a child process now, without caching (a candidate file being validated)."""
        return self._introspect(env)

    def get(self, name: str) -> EnvironmentInfo:
        validate_name(name, "environment name")
        environments, _ = self.discover()
        for env in environments:
            if env.name == name:
                return env
        raise EnvironmentNotFound(
            f"no environment named {name!r}",
            {"name": name, "available": [e.name for e in environments]},
        )

    def config_schema(self, env: EnvironmentInfo) -> ConfigSchema:
        """Import the environment in a child process (once per version of its directory) and read its config."""
        key = (env.file_path, env.class_name, _directory_signature(env.file_path.parent))
        with self._lock:
            cached = self._schemas.get(key)
            file_lock = self._schema_locks.setdefault(env.file_path, threading.Lock())
        if cached:
            return cached
        with file_lock:  # one child per environment at a time; later callers get the cached result
            with self._lock:
                cached = self._schemas.get(key)
            if cached:
                return cached
            schema = self._introspect(env)
            with self._lock:
                self._schemas = {k: v for k, v in self._schemas.items() if k[:2] != key[:2]}
                self._schemas[key] = schema
            return schema

    def _scan(self, path: Path) -> FileScan:
        try:
            stat = path.stat()
            signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            cached = self._scans.get(path)
            if cached and cached[0] == signature:
                return cached[1]
            scan = scan_source(path, path.read_bytes().decode("utf-8", errors="replace"))
        except OSError as exc:
            return FileScan(path, error=f"{type(exc).__name__}: {exc}")
        self._scans[path] = (signature, scan)
        return scan

    def _introspect(self, env: EnvironmentInfo) -> ConfigSchema:
        with tempfile.TemporaryDirectory(prefix="rlctl-introspect-") as tmp:
            output = Path(tmp) / "schema.json"
            command = [
                sys.executable,
                "-m",
                "service.environments.introspect",
                str(env.file_path),
                env.class_name,
                str(output),
            ]
            try:
                completed = subprocess.run(
                    command,
                    cwd=REPO_ROOT,
                    env=dict(self._child_environment()),
                    capture_output=True,
                    timeout=self._schema_timeout_s,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired as exc:
                raise EnvironmentLoadFailed(
                    f"importing environment {env.name!r} took longer than {self._schema_timeout_s:g} s",
                    {"name": env.name},
                ) from exc
            result = _read_result(output)
        if not result or not result.get("ok"):
            reason = (result or {}).get("error") or _tail(completed.stderr)
            trace = (result or {}).get("traceback") or _tail(completed.stderr, 20).split(" | ")
            raise EnvironmentLoadFailed(
                f"environment {env.name!r} could not be loaded: {reason}", {"name": env.name, "traceback": trace}
            )
        return ConfigSchema(
            config_class=result["config_class"],
            fields=tuple(FieldSchema(**f) for f in result["fields"]),
            defs=result["defs"],
        )


def _read_result(output: Path) -> dict[str, Any] | None:
    try:
        return json.loads(output.read_text())
    except (OSError, ValueError):
        return None


def _tail(stderr: bytes, lines: int = 5) -> str:
    text = stderr.decode("utf-8", errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "the child process exited without a result"


def _directory_signature(directory: Path) -> tuple[Any, ...]:
    """Changes when any Python file beside the environment changes (its bases may live there)."""
    entries = []
    for path in sorted(directory.glob("*.py")):
        try:
            stat = path.stat()
        except OSError:
            continue
        entries.append((path.name, stat.st_mtime_ns, stat.st_size))
    return tuple(entries)


def child_process_environment(secret_names: set[str]) -> dict[str, str]:
    """The service's environment minus every secret: environment code is imported there."""
    return {k: v for k, v in os.environ.items() if k not in secret_names}
