"""Fixtures for the harness's own tests; other suites import them from tests.harness.fixtures
in their conftest.py the same way."""

from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)
