"""One Spark session for the whole test run: starting one costs 8-15 s here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


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
