"""Errors of the datasets and collections domains (stable codes; one error body, see rlctl/service/errors.py)."""

from __future__ import annotations

from rlctl.service.errors import Conflict, NotFound, ValidationFailed


class DatasetNotFound(NotFound):
    code = "DATASET_NOT_FOUND"
    subject, id_field = "dataset", "dataset_id"


class ExportNotFound(NotFound):
    code = "EXPORT_NOT_FOUND"


class CollectionNotFound(NotFound):
    code = "COLLECTION_NOT_FOUND"
    subject, id_field = "collection", "collection_id"


class SandboxUnavailable(Conflict):
    """`terminal` was asked for where no sandbox can be made; it never runs unsandboxed."""

    code = "SANDBOX_UNAVAILABLE"


class InvalidRecords(ValidationFailed):
    """Some items of an upload could not be read or converted; `details.errors` lists them by line."""

    code = "INVALID_RECORDS"


class InvalidEncoding(ValidationFailed):
    code = "INVALID_ENCODING"


class EmptyUpload(ValidationFailed):
    code = "EMPTY_UPLOAD"


class UnknownTokenizer(NotFound):
    """A request named a tokenizer that is not available here (like an unknown environment: 404)."""

    code = "TOKENIZER_NOT_FOUND"


class SummarizerNotConfigured(Conflict):
    """A model summary was asked for, but the server has no summariser endpoint configured."""

    code = "SUMMARIZER_NOT_CONFIGURED"


class DatasetBusy(Conflict):
    """A job is still reading the dataset."""

    code = "DATASET_BUSY"
