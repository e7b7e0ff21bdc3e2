"""The wing's errors: each message says why, in words a caller may pass on as they are."""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error the sandbox raises."""


class SandboxUnavailable(SandboxError):
    """No sandbox can be made here; the message is the reason (e.g. bwrap missing, user namespaces refused)."""


class NetworkUnavailable(SandboxUnavailable):
    """A sandbox can be made, but not given a network: there is no Python under /usr to run its relay."""


class DestinationError(SandboxError, ValueError):
    """A network destination that cannot be named; `code` is stable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class WorkDirRefusal(SandboxError):
    """A file access the work directory refuses (a path out of it, a link, a missing file, the disk limit)."""
