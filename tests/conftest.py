"""Shared pytest configuration, and the one Spark session of a test run (starting one costs
8-15 s here; every directory's pipeline tests share it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.simulation.test_random_schedules import SUMMARY_KEY

# Speed is measured in benchmarks, never in tests: on a loaded 2-core machine one generated
# example can take longer than Hypothesis's default 200 ms deadline, which says nothing
# about correctness.
settings.register_profile("flotilla", deadline=None)
settings.load_profile("flotilla")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(SUMMARY_KEY, []):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="the pipeline extra is not installed: "
                        "pip install 'flotilla[pipeline]'")
    from flotilla.pipeline.spark import spark_session

    session = spark_session("local[2]", app="flotilla-tests")
    try:
        yield session
    finally:
        session.stop()
