"""The pipeline tests' fixtures: the session's Spark (tests/conftest.py), and real clusters
archiving to a real moto_server, as the process-level archive tests run them."""

from tests.archive_node.conftest import moto_s3, node_aws_env, s3_store  # noqa: F401
from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)
