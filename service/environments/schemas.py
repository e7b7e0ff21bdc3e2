"""HTTP models of the environment catalog."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.settings import Backend


class EnvironmentSummary(BaseModel):
    name: str
    class_name: str
    file_path: str
    description: str
    config_class: str | None


class CatalogError(BaseModel):
    name: str
    file_path: str
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
    value: Any = None
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
