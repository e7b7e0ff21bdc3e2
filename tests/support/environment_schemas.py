"""One import of each environment per test session, for tests that are not about importing environments.

The service reads an environment's config schema by importing it in a child process (seconds of CPU: atroposlib,
transformers), once per app. Most tests start an app of their own and need the same schema of the same file, so
the suite keeps the result for the session: the key is everything the child's answer depends on (the file, the
class, the version of every Python file beside it, the child's environment). Failures are never kept. Tests about
the import itself are marked `real_introspection` and always run the child.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rlctl.service.environments.catalog import ConfigSchema, EnvironmentCatalog, _directory_signature
from rlctl.service.environments.discovery import EnvironmentInfo

_schemas: dict[tuple[Any, ...], ConfigSchema] = {}
_lock = threading.Lock()


@contextmanager
def shared_schemas() -> Iterator[None]:
    """While open, every catalog reuses a schema this session already read."""
    original: Callable[[EnvironmentCatalog, EnvironmentInfo], ConfigSchema] = EnvironmentCatalog._introspect

    def introspect_once(catalog: EnvironmentCatalog, env: EnvironmentInfo) -> ConfigSchema:
        key = (
            env.file_path,
            env.class_name,
            _directory_signature(env.file_path.parent),
            frozenset((k, v) for k, v in catalog._child_environment().items() if k != "PYTEST_CURRENT_TEST"),
        )
        with _lock:
            known = _schemas.get(key)
        if known is not None:
            return known
        schema = original(catalog, env)
        with _lock:
            _schemas[key] = schema
        return schema

    EnvironmentCatalog._introspect = introspect_once  # type: ignore[method-assign]
    try:
        yield
    finally:
        EnvironmentCatalog._introspect = original  # type: ignore[method-assign]
