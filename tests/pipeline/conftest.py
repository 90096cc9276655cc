"""The pipeline tests' fixtures: the session's Spark (tests/conftest.py), and real clusters
archiving to a real moto_server, as the process-level archive tests run them."""

import pytest

from tests.archive_node.conftest import moto_s3, node_aws_env, s3_store  # noqa: F401
from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)


@pytest.fixture(scope="session", autouse=True)
def _aws_credentials_before_spark(request: pytest.FixtureRequest) -> None:
    """Spark's Python workers keep the environment the session started with, so the dummy AWS
    credentials (for moto_server) must be set before any test here starts Spark, whichever
    test comes first."""
    request.getfixturevalue("node_aws_env")
