"""HTTP models of the environment catalog."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlctl.service.schemas import ServerPath, ServerValue
from rlctl.service.settings import Backend

# The shipped environments that train a dataset's records (environments/dataset_*.py): a run of one is started
# with POST /runs `dataset`, never by its name (docs/RUNS.md#training-on-a-dataset).
DATASET_OFFLINE, DATASET_ONLINE = "dataset_offline", "dataset_online"
DATASET_ONLY = frozenset({DATASET_OFFLINE, DATASET_ONLINE})


class EnvironmentSummary(BaseModel):
    name: str
    class_name: str
    file_path: ServerPath
    description: str
    config_class: str | None
    trainable_by_name: bool = Field(
        description="False for dataset_offline and dataset_online: they train a dataset's records, so a run of one "
        "is started with POST /runs `dataset` (docs/RUNS.md#training-on-a-dataset), never by its name."
    )


class CatalogError(BaseModel):
    name: str
    file_path: ServerPath
    error: str


class EnvironmentList(BaseModel):
    environments: list[EnvironmentSummary]
    count: int
    errors: list[CatalogError]


class ConfigurableFieldOut(BaseModel):
    name: str
    type: str
    default: Any = None
    description: str


class LockedFieldOut(BaseModel):
    name: str
    type: str
    value: ServerValue = None
    description: str


class EnvironmentDetail(EnvironmentSummary):
    backend: Backend
    configurable_fields: list[ConfigurableFieldOut]
    locked_fields: list[LockedFieldOut]


class ConfigPreviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(default_factory=dict, description="Edits of configurable fields.")
    backend: Backend | None = Field(None, description="Training backend; the server's default when absent.")


class ConfigPreview(BaseModel):
    environment: str
    backend: Backend
    config: dict[str, Any] = Field(description="The merged config, by YAML section.")
    yaml: str


# --- environment source: read, write, versions (docs/ENVIRONMENTS.md#writing-environments) ---

MAX_SOURCE_CHARS = 512 * 1024
HASH_PATTERN = r"^[0-9a-f]{64}$"


class EnvironmentSource(BaseModel):
    name: str
    hash: str = Field(description="SHA-256 of the source (UTF-8); send it as If-Match to replace this version.")
    source: str
    managed: bool = Field(description="Written through the API (may be replaced, rolled back, deleted).")
    version: int | None = Field(description="The managed version this source is; null for a shipped environment.")


class WriteEnvironmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=MAX_SOURCE_CHARS, description="The environment file's Python source.")


class ValidationCheck(BaseModel):
    check: str = Field(description="syntax, environment_class, name, name_clash or import")
    ok: bool
    message: str
    line: int | None = None
    column: int | None = None
    traceback: list[str] | None = Field(None, description="The import's traceback tail (import check).")


class ValidationReport(BaseModel):
    ok: bool
    checks: list[ValidationCheck]
    class_name: str | None = None
    config_class: str | None = None


class EnvironmentWritten(BaseModel):
    name: str
    hash: str
    version: int
    created: bool = Field(description="True when the environment did not exist before.")
    file_path: ServerPath
    validation: ValidationReport


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, description="The version whose source becomes the current one (as a new version).")


class EnvironmentVersion(BaseModel):
    version: int
    hash: str
    action: str = Field(description="write or rollback")
    from_version: int | None = Field(None, description="The version a rollback restored.")
    created_at: str
    created_by: str | None = Field(description="The name of the token that wrote it.")
    current: bool


class EnvironmentVersions(BaseModel):
    name: str
    versions: list[EnvironmentVersion]
    count: int


class EnvironmentDeleted(BaseModel):
    name: str
    deleted_version: int | None
