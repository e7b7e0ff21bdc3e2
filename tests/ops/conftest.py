"""Fixtures of tests/ops: the runs fixtures (real processes, fast local settings, clean-up) are shared."""

from tests.runs.conftest import process_database_url, run_settings  # noqa: F401 - pytest fixtures
