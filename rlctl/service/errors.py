"""One error hierarchy, mapped to one error body: {"error": {"code", "message", "details"}}.

Services raise these; the HTTP layer maps them (rlctl/service/http.py) and the agent tools turn them into
results with an `error` field (rlctl/service/tools/registry.py). Codes are stable: clients and agents branch on them.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status_code = 400
    code = "BAD_REQUEST"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        self.extra: dict[str, Any] = {}  # top-level fields some errors add beside "error"

    def to_body(self, request_id: str | None = None) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "details": self.details}
        if request_id:
            error["request_id"] = request_id
        return {"error": error, **self.extra}


class Unauthorized(ServiceError):
    status_code = 401
    code = "UNAUTHORIZED"


class NotFound(ServiceError):
    status_code = 404
    code = "NOT_FOUND"
    subject = "item"  # what is missing, in messages: "no run with id 'abc'"
    id_field = "id"  # the detail naming its id

    @classmethod
    def for_id(cls, item_id: str) -> NotFound:
        return cls(f"no {cls.subject} with id {item_id!r}", {cls.id_field: item_id})


class EnvironmentNotFound(NotFound):
    code = "ENVIRONMENT_NOT_FOUND"


class RunNotFound(NotFound):
    code = "RUN_NOT_FOUND"
    subject, id_field = "run", "run_id"


class CheckpointNotFound(NotFound):
    code = "CHECKPOINT_NOT_FOUND"
    subject, id_field = "checkpoint", "step"


class Conflict(ServiceError):
    status_code = 409
    code = "CONFLICT"


class InvalidState(Conflict):
    code = "INVALID_STATE"


class ClientGone(ServiceError):
    code = "CLIENT_DISCONNECTED"


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "PAYLOAD_TOO_LARGE"


class ValidationFailed(ServiceError):
    status_code = 422
    code = "VALIDATION_ERROR"


class InvalidValue(ValidationFailed):
    code = "INVALID_VALUE"


class InvalidName(ValidationFailed):
    code = "INVALID_NAME"


class UnknownField(ValidationFailed):
    code = "UNKNOWN_FIELD"


class FieldLocked(ValidationFailed):
    code = "FIELD_LOCKED"


class RateLimited(ServiceError):
    status_code = 429
    code = "RATE_LIMITED"

    def __init__(self, message: str, retry_after_s: float, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.retry_after_s = retry_after_s
        self.extra = dict(details or {})


class Unavailable(ServiceError):
    status_code = 503
    code = "UNAVAILABLE"


class EnvironmentLoadFailed(ServiceError):
    """The environment file could not be imported (in its child process) or timed out."""

    status_code = 422
    code = "ENVIRONMENT_LOAD_FAILED"


class BackendUnavailable(ServiceError):
    """The chosen training backend lacks what it needs here (e.g. tinker without TINKER_API_KEY)."""

    status_code = 409
    code = "BACKEND_UNAVAILABLE"


class ResourcesExceedCapacity(ValidationFailed):
    """A run asks for more than its executor ever has (e.g. a GPU on a host without one): it could never start."""

    code = "RESOURCES_EXCEED_CAPACITY"


class InsufficientScope(ServiceError):
    """The token is valid but lacks the scope the route or tool needs (docs/AUTH.md#scopes)."""

    status_code = 403
    code = "INSUFFICIENT_SCOPE"


class PreconditionFailed(ServiceError):
    """If-Match named another version than the current one: someone else changed it (no lost update)."""

    status_code = 412
    code = "PRECONDITION_FAILED"


class EnvironmentInvalid(ValidationFailed):
    """Environment source that failed validation; details.validation says which check and why."""

    code = "ENVIRONMENT_INVALID"


class EnvironmentNotManaged(Conflict):
    """A shipped (or operator-installed) environment: the API does not change or delete it."""

    code = "ENVIRONMENT_NOT_MANAGED"


class EnvironmentInUse(Conflict):
    code = "ENVIRONMENT_IN_USE"


class EnvironmentVersionNotFound(NotFound):
    code = "ENVIRONMENT_VERSION_NOT_FOUND"
