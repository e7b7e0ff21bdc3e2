"""The environment catalog: what is in the environment directories now, and each one's config schema."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.service.children import ChildRunner
from rlctl.service.context import Component
from rlctl.service.environments.discovery import (
    DiscoveryError,
    EnvironmentInfo,
    FileScan,
    environment_files,
    resolve_environments,
    scan_source,
)
from rlctl.service.errors import EnvironmentLoadFailed, EnvironmentNotFound
from rlctl.service.names import validate_name

REPO_ROOT = Path(__file__).resolve().parents[3]
# Suffixes a name may carry and still mean the environment without it (the Hermes tools' names).
ALIAS_SUFFIXES = ("_tinker", "-tinker", "_env")
# Part of every stored schema's key: a change to what the child writes, or how it is read, starts afresh.
SCHEMA_STORE_VERSION = 1
# The child's environment variables that take part in the stored key (an environment's config_init() may read
# them, e.g. RLCTL_DATA_DIR for its default tokenizer); secrets never reach the child, so never the key.
KEYED_ENVIRONMENT_PREFIXES = ("RLCTL_", "HF_", "TRANSFORMERS_", "PYTHONPATH")


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


class EnvironmentCatalog(Component):
    """Re-scans on every listing (files are stat-ed; only changed ones are parsed again)."""

    def __init__(
        self,
        directories: Callable[[], list[Path]],
        schema_timeout_s: float,
        child_environment: Callable[[], Mapping[str, str]],
        store_dir: Path | None = None,
        children: ChildRunner | None = None,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self._directories = directories
        # Environment code can read the service's secrets (its .env file, its parent's environment): what its
        # import prints comes back scrubbed of them.
        self._scrub = scrub
        self._schema_timeout_s = schema_timeout_s
        self._child_environment = child_environment
        self._store = SchemaStore(store_dir) if store_dir is not None else None
        self._children = children or ChildRunner()
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
        by_name = {env.name: env for env in environments}
        resolved = resolve_alias(name, by_name)
        if resolved is not None:
            return by_name[resolved]
        raise EnvironmentNotFound(
            f"no environment named {name!r}",
            {"name": name, "available": [e.name for e in environments]},
        )

    def config_schema(self, env: EnvironmentInfo) -> ConfigSchema:
        """The environment's config schema: kept in memory per version of its directory, and on disk (the schema
        store) by the content of its directory, so a restarted service reads it back; otherwise imported in a
        child process now. One child per file at a time; later callers get its result."""
        key = self._memory_key(env)
        with self._lock:
            cached = self._schemas.get(key)
            file_lock = self._schema_locks.setdefault(env.file_path, threading.Lock())
        if cached:
            return cached
        with file_lock:
            schema = self._remembered(key)
            if schema is None:
                store_key = self._store_key(env)
                schema = self._load(key, store_key)
                if schema is None:
                    schema = self._introspect(env)
                    self._keep(key, schema, store_key)
            return schema

    def warm(self) -> None:
        """Read every discovered environment's schema that is not known yet (docs/ENVIRONMENTS.md#config-schema):
        one child per directory for all of its environments, holding their files' locks meanwhile, so a caller
        that asks for one of them waits for this child instead of starting its own. A class the child could not
        describe is left to be read (and its error reported) when asked for."""
        environments, _ = self.discover()
        by_directory: dict[Path, list[EnvironmentInfo]] = {}
        for env in environments:
            by_directory.setdefault(env.file_path.parent, []).append(env)
        for envs in by_directory.values():
            self._warm_directory(envs)

    def _warm_directory(self, envs: list[EnvironmentInfo]) -> None:
        with self._lock:
            locks = [
                self._schema_locks.setdefault(path, threading.Lock()) for path in sorted({e.file_path for e in envs})
            ]
        for lock in locks:  # always in path order: config_schema holds at most one of them
            lock.acquire()
        try:
            pending = []
            for env in envs:
                key = self._memory_key(env)
                if self._remembered(key) is None:
                    store_key = self._store_key(env)
                    if self._load(key, store_key) is None:
                        pending.append((env, key, store_key))
            if not pending:
                return
            schemas = self._introspect_many([env for env, _, _ in pending])
            for (_, key, store_key), schema in zip(pending, schemas, strict=True):
                if schema is not None:
                    self._keep(key, schema, store_key)
        finally:
            for lock in reversed(locks):
                lock.release()

    def _memory_key(self, env: EnvironmentInfo) -> tuple[Path, str, tuple[Any, ...]]:
        return (env.file_path, env.class_name, _directory_signature(env.file_path.parent))

    def _remembered(self, key: tuple[Path, str, tuple[Any, ...]]) -> ConfigSchema | None:
        with self._lock:
            return self._schemas.get(key)

    def _load(self, key: tuple[Path, str, tuple[Any, ...]], store_key: str | None) -> ConfigSchema | None:
        """The stored schema (then kept in memory too); None when there is no store or it has none."""
        stored = self._store.load(store_key) if self._store is not None and store_key is not None else None
        if stored is not None:
            self._remember(key, stored)
        return stored

    def _keep(self, key: tuple[Path, str, tuple[Any, ...]], schema: ConfigSchema, store_key: str | None) -> None:
        """A schema just read from a child: in memory, and in the store."""
        self._remember(key, schema)
        if self._store is not None and store_key is not None:
            self._store.save(store_key, schema)

    def _remember(self, key: tuple[Path, str, tuple[Any, ...]], schema: ConfigSchema) -> None:
        with self._lock:  # one version per (file, class): an older one is dropped
            self._schemas = {k: v for k, v in self._schemas.items() if k[:2] != key[:2]}
            self._schemas[key] = schema

    def _store_key(self, env: EnvironmentInfo) -> str | None:
        """Everything the child's answer depends on: the file, the class, the content of every Python file beside
        it (its bases may live there), the interpreter and the keyed part of the child's environment. Computed
        once per miss (it reads the directory's files); None without a store."""
        if self._store is None:
            return None
        child = self._child_environment()
        parts = {
            "version": SCHEMA_STORE_VERSION,
            "file": str(env.file_path),
            "class": env.class_name,
            "files": _directory_digest(env.file_path.parent),
            "python": sys.executable,
            "environment": sorted((k, v) for k, v in child.items() if k.startswith(KEYED_ENVIRONMENT_PREFIXES)),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

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
            arguments = [str(env.file_path), env.class_name, str(output)]
            try:
                completed = self._run_child(arguments, self._schema_timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise EnvironmentLoadFailed(
                    f"importing environment {env.name!r} took longer than {self._schema_timeout_s:g} s",
                    {"name": env.name},
                ) from exc
            result = _read_result(output)
        if not isinstance(result, dict) or not result.get("ok"):
            result = result if isinstance(result, dict) else {}
            reason = self._scrub(str(result.get("error") or _tail(completed.stderr)))
            trace = result.get("traceback") or _tail(completed.stderr, 20).split(" | ")
            raise EnvironmentLoadFailed(
                f"environment {env.name!r} could not be loaded: {reason}",
                {"name": env.name, "traceback": [self._scrub(str(line)) for line in trace]},
            )
        return _schema_of(result)

    def _introspect_many(self, envs: list[EnvironmentInfo]) -> list[ConfigSchema | None]:
        """One child for several environments of one directory; None for each it could not describe (the whole
        batch when the child fails or runs out of time: each is then read on its own when asked for)."""
        timeout_s = self._schema_timeout_s * len(envs)
        with tempfile.TemporaryDirectory(prefix="rlctl-introspect-") as tmp:
            requests, output = Path(tmp) / "requests.json", Path(tmp) / "schemas.json"
            requests.write_text(json.dumps([[str(env.file_path), env.class_name] for env in envs]))
            try:
                self._run_child(["--batch", str(requests), str(output)], timeout_s)
            except (subprocess.TimeoutExpired, OSError):  # ChildProcessError (the service stopping) included
                return [None] * len(envs)
            results = _read_result(output)
        if not isinstance(results, list) or len(results) != len(envs):
            return [None] * len(envs)
        return [_schema_of(r) if isinstance(r, dict) and r.get("ok") else None for r in results]

    def _run_child(self, arguments: list[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        return self._children.run(
            [sys.executable, "-m", "rlctl.service.environments.introspect", *arguments],
            env=self._child_environment(),
            cwd=REPO_ROOT,
            timeout_s=timeout_s,
        )


class SchemaStore:
    """Config schemas on disk, one JSON file per key (`{data_dir}/cache/environment_schemas/`). A file that
    cannot be read is a miss; a write goes to a temporary name first, so a reader never sees half of one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self, key: str) -> ConfigSchema | None:
        result = _read_result(self.directory / f"{key}.json")
        if not isinstance(result, dict):
            return None
        try:
            return _schema_of(result)
        except (KeyError, TypeError):
            return None

    def save(self, key: str, schema: ConfigSchema) -> None:
        body = {
            "config_class": schema.config_class,
            "fields": [field.__dict__ for field in schema.fields],
            "defs": schema.defs,
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            staging = self.directory / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            staging.write_text(json.dumps(body))
            staging.replace(self.directory / f"{key}.json")
        except (OSError, TypeError, ValueError):
            return  # the store only saves time: the schema stays in memory


def _schema_of(result: dict[str, Any]) -> ConfigSchema:
    return ConfigSchema(
        config_class=result["config_class"],
        fields=tuple(FieldSchema(**f) for f in result["fields"]),
        defs=result["defs"],
    )


def _read_result(output: Path) -> Any:
    try:
        return json.loads(output.read_text())
    except (OSError, ValueError):
        return None


def _tail(stderr: bytes, lines: int = 5) -> str:
    text = stderr.decode("utf-8", errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "the child process exited without a result"


def resolve_alias(name: str, names: Collection[str]) -> str | None:
    """The environment a name means: itself, else the name less a suffix the Hermes tools use
    (`gsm8k_tinker` is `gsm8k`; docs/ENVIRONMENTS.md#names-and-aliases); None when it means none."""
    if name in names:
        return name
    for suffix in ALIAS_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in names:
            return name[: -len(suffix)]
    return None


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


def _directory_digest(directory: Path) -> list[tuple[str, str]]:
    """The content of every Python file beside an environment, by SHA-256."""
    digests = []
    for path in sorted(directory.glob("*.py")):
        try:
            digests.append((path.name, hashlib.sha256(path.read_bytes()).hexdigest()))
        except OSError:
            continue
    return digests


def child_process_environment(secret_names: set[str]) -> dict[str, str]:
    """The service's environment minus every secret: environment code is imported there."""
    return {k: v for k, v in os.environ.items() if k not in secret_names}
