"""Environments written through the API: read any source, write managed ones after validation, keep every
version, roll back, delete (docs/ENVIRONMENTS.md#writing-environments).

Managed files live in `{data}/environments/{name}.py` (discovered like the others, scanned last); every version
in `{data}/environment_versions/{name}/{NNNNNN}.py` with a `.json` beside it. Changes to one name are serialised
by a lock file, so If-Match is a compare-and-set.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from rlctl.service.context import AppContext
from rlctl.service.db.models import Run
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.environments.discovery import EnvironmentInfo
from rlctl.service.environments.schemas import (
    EnvironmentDeleted,
    EnvironmentSource,
    EnvironmentVersion,
    EnvironmentVersions,
    EnvironmentWritten,
    RollbackRequest,
    ValidationCheck,
    ValidationReport,
    WriteEnvironmentRequest,
)
from rlctl.service.environments.validation import check_source
from rlctl.service.errors import (
    EnvironmentInUse,
    EnvironmentInvalid,
    EnvironmentLoadFailed,
    EnvironmentNotFound,
    EnvironmentNotManaged,
    EnvironmentVersionNotFound,
    PreconditionFailed,
)
from rlctl.service.names import validate_name
from rlctl.service.observability import actor_var
from rlctl.service.states import RUN_ACTIVE

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def source_hash(source: str | bytes) -> str:
    data = source.encode("utf-8") if isinstance(source, str) else source
    return hashlib.sha256(data).hexdigest()


# --- read ---


def read_source(ctx: AppContext, name: str) -> EnvironmentSource:
    env = EnvironmentCatalog.of(ctx).get(name)
    data = env.file_path.read_bytes()  # once: the hash is of exactly the text returned
    managed = is_managed(ctx, env)
    return EnvironmentSource(
        name=env.name,
        hash=source_hash(data),
        source=data.decode("utf-8", errors="replace"),
        managed=managed,
        version=_current_version(ctx, name) if managed else None,
    )


def list_versions(ctx: AppContext, name: str) -> EnvironmentVersions:
    validate_name(name, "environment name")
    versions = _versions(ctx, name)
    if not versions and not _managed_file(ctx, name).exists():
        EnvironmentCatalog.of(ctx).get(name)  # 404 for an unknown name
    current = _current_version(ctx, name)
    listed = [EnvironmentVersion(**meta, current=meta["version"] == current) for meta in versions]
    return EnvironmentVersions(name=name, versions=listed, count=len(listed))


# --- write, roll back, delete ---


def write_environment(
    ctx: AppContext, name: str, request: WriteEnvironmentRequest, if_match: str | None = None
) -> EnvironmentWritten:
    """Validate, then store as the next version and make it current. Stores nothing when a check fails."""
    validate_name(name, "environment name")
    _check_precondition(ctx, name, if_match)  # early: no child process for a stale write
    report = validate(ctx, name, request.source)
    if not report.ok:
        failed = next(c for c in report.checks if not c.ok)
        raise EnvironmentInvalid(
            f"the environment source failed the {failed.check} check: {failed.message}",
            {"validation": report.model_dump(mode="json")},
        )
    with _name_lock(ctx, name):
        created = not _managed_file(ctx, name).exists()
        _check_precondition(ctx, name, if_match)
        version = _store(ctx, name, request.source, "write")
    return EnvironmentWritten(
        name=name,
        hash=source_hash(request.source),
        version=version,
        created=created,
        file_path=str(_managed_file(ctx, name)),
        validation=report,
    )


def rollback_environment(
    ctx: AppContext, name: str, request: RollbackRequest, if_match: str | None = None
) -> EnvironmentWritten:
    """The source of an earlier version becomes current again, as a new version, after the same validation."""
    validate_name(name, "environment name")
    path = _version_file(ctx, name, request.version)
    if not path.with_suffix(".json").exists():
        raise EnvironmentVersionNotFound(
            f"environment {name!r} has no version {request.version}",
            {"name": name, "version": request.version, "available": [v["version"] for v in _versions(ctx, name)]},
        )
    source = path.read_text(encoding="utf-8")
    _check_precondition(ctx, name, if_match)
    report = validate(ctx, name, source)
    if not report.ok:
        failed = next(c for c in report.checks if not c.ok)
        raise EnvironmentInvalid(
            f"version {request.version} no longer passes the {failed.check} check: {failed.message}",
            {"validation": report.model_dump(mode="json")},
        )
    with _name_lock(ctx, name):
        created = not _managed_file(ctx, name).exists()
        _check_precondition(ctx, name, if_match)
        version = _store(ctx, name, source, "rollback", from_version=request.version)
    return EnvironmentWritten(
        name=name,
        hash=source_hash(source),
        version=version,
        created=created,
        file_path=str(_managed_file(ctx, name)),
        validation=report,
    )


def delete_environment(ctx: AppContext, name: str, if_match: str | None = None) -> EnvironmentDeleted:
    """Remove a managed environment (its versions stay, for a rollback); never a shipped one, nor one in use."""
    env = EnvironmentCatalog.of(ctx).get(name)
    if not is_managed(ctx, env):
        raise EnvironmentNotManaged(
            f"environment {name!r} is shipped or operator-installed ({env.file_path}); only environments written "
            "through the API can be deleted",
            {"name": name},
        )
    with _name_lock(ctx, name):
        _check_precondition(ctx, name, if_match)
        with ctx.db.session() as session:
            users = session.scalars(select(Run.id).where(Run.environment == name, Run.status.in_(RUN_ACTIVE))).all()
        if users:
            raise EnvironmentInUse(
                f"environment {name!r} is used by {len(users)} active run(s); stop them first",
                {"name": name, "run_ids": list(users)},
            )
        version = _current_version(ctx, name)
        _managed_file(ctx, name).unlink(missing_ok=True)
    return EnvironmentDeleted(name=name, deleted_version=version)


# --- validation ---


def validate(ctx: AppContext, name: str, source: str) -> ValidationReport:
    """Parse, one BaseEnv subclass named `name`, no clash with an environment the API does not manage, then the
    config-schema import in a child process with the time-out (a staged copy, never the live file)."""
    target = _managed_file(ctx, name)
    other_scans = [scan for scan in EnvironmentCatalog.of(ctx).scans() if scan.path != target]
    environments, _ = EnvironmentCatalog.of(ctx).discover()
    taken = {e.name: str(e.file_path) for e in environments if not is_managed(ctx, e)}
    checks, class_name = check_source(name, source, target, other_scans, taken)
    if class_name is None:
        return ValidationReport(ok=False, checks=checks)
    staging = ctx.settings.data_path / "environments_staging"
    staging.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=staging) as directory:
        staged = Path(directory) / f"{name}.py"
        staged.write_text(source, encoding="utf-8")
        candidate = EnvironmentInfo(name, class_name, staged, "", None)
        try:
            schema = EnvironmentCatalog.of(ctx).introspect(candidate)
        except EnvironmentLoadFailed as failure:
            trace = failure.details.get("traceback") or []
            checks.append(ValidationCheck(check="import", ok=False, message=failure.message, traceback=trace))
            return ValidationReport(ok=False, checks=checks, class_name=class_name)
    checks.append(ValidationCheck(check="import", ok=True, message=f"config class {schema.config_class}"))
    return ValidationReport(ok=True, checks=checks, class_name=class_name, config_class=schema.config_class)


# --- storage ---


def is_managed(ctx: AppContext, env: EnvironmentInfo) -> bool:
    return env.file_path.parent == ctx.settings.managed_environments_dir


def _managed_file(ctx: AppContext, name: str) -> Path:
    return ctx.settings.managed_environments_dir / f"{name}.py"


def _version_file(ctx: AppContext, name: str, version: int) -> Path:
    return ctx.settings.environment_versions_dir / name / f"{version:06d}.py"


def _versions(ctx: AppContext, name: str) -> list[dict[str, Any]]:
    directory = ctx.settings.environment_versions_dir / name
    if not directory.is_dir():
        return []
    metas = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]
    return sorted(metas, key=lambda m: m["version"])


def _current_version(ctx: AppContext, name: str) -> int | None:
    """The newest version, while the managed file exists and holds its source."""
    path = _managed_file(ctx, name)
    versions = _versions(ctx, name)
    if not versions or not path.exists():
        return None
    return versions[-1]["version"] if versions[-1]["hash"] == source_hash(path.read_bytes()) else None


def _current_hash(ctx: AppContext, name: str) -> str | None:
    path = _managed_file(ctx, name)
    if path.exists():
        return source_hash(path.read_bytes())
    with contextlib.suppress(EnvironmentNotFound):
        return source_hash(EnvironmentCatalog.of(ctx).get(name).file_path.read_bytes())
    return None


def _check_precondition(ctx: AppContext, name: str, if_match: str | None) -> None:
    """If-Match: the hash the writer read (quoted or not), or `*` for "it exists"."""
    if if_match is None:
        return
    expected = if_match.strip().removeprefix("W/").strip('"')
    current = _current_hash(ctx, name)
    if current is None or (expected != "*" and expected != current):
        raise PreconditionFailed(
            f"environment {name!r} is not at the version If-Match names: read it again and reapply your change",
            {"name": name, "current_hash": current, "if_match": expected},
        )


def _store(ctx: AppContext, name: str, source: str, action: str, from_version: int | None = None) -> int:
    versions = _versions(ctx, name)
    version = versions[-1]["version"] + 1 if versions else 1
    version_path = _version_file(ctx, name, version)
    version_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(version_path, source)
    meta = {
        "version": version,
        "hash": source_hash(source),
        "action": action,
        "from_version": from_version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "created_by": actor_var.get(),
    }
    _write_atomically(version_path.with_suffix(".json"), json.dumps(meta, indent=2))
    ctx.settings.managed_environments_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(_managed_file(ctx, name), source)  # last: the live file changes only once all is kept
    return version


def _write_atomically(path: Path, text: str) -> None:
    # The temporary name does not end in .py, so discovery never sees a half-written file.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def _name_lock(ctx: AppContext, name: str) -> Iterator[None]:
    """One writer per name: a thread lock here, and a file lock for other processes on the data directory."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(name, threading.Lock())
    directory = ctx.settings.environment_versions_dir
    directory.mkdir(parents=True, exist_ok=True)
    with lock, open(directory / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
