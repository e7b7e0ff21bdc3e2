"""Every kind of background job, registered in one place (each domain provides its handlers)."""

from __future__ import annotations

from service.collections import runner as collection_runner
from service.datasets import operations as dataset_operations
from service.jobs.runner import JobRunner


def register_job_kinds(runner: JobRunner) -> None:
    """Datasets, inference tests and collections add their kinds here."""
    dataset_operations.register(runner)
    collection_runner.register(runner)
    from service.inference_tests import service as inference_tests

    inference_tests.register(runner)
