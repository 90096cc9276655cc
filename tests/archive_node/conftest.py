"""Fixtures of the process-level archive tests: real ``flotilla node`` clusters archiving to a
real ``moto_server`` (one per session, started by the helpers of tests/archive/stores.py, each
test under its own prefix of one bucket) or to a ``file://`` directory.

The node processes get dummy AWS credentials in their environment (boto3's standard chain,
exactly as in production); the test process has the same ones, to read the bucket with boto3
and the archive with ``ClusterArchive``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.archive.stores import (
    BUCKET,
    S3Server,
    aws_environment,
    moto_server_path,
    start_moto,
)
from tests.archive_node.support import REGION, Bucket, Store
from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)


@pytest.fixture(scope="session")
def node_aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Dummy credentials and region, set for this process for the session and returned for the
    node processes' environment."""
    env = {**aws_environment(tmp_path_factory.mktemp("aws")), "AWS_DEFAULT_REGION": REGION}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        yield env


@pytest.fixture(scope="session")
def moto_s3(node_aws_env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real moto_server process on loopback (state in memory) with the test bucket."""
    if moto_server_path() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        server.raw_client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_store(moto_s3: S3Server, node_aws_env: dict[str, str]) -> Store:
    """An S3 archive root of its own: ``s3://<bucket>/<unique prefix>`` on moto_server."""
    prefix = f"an-{uuid.uuid4().hex[:10]}"
    return Store(f"s3://{BUCKET}/{prefix}", moto_s3.endpoint, dict(node_aws_env))


@pytest.fixture
def bucket(moto_s3: S3Server, s3_store: Store) -> Bucket:
    """boto3 access to ``s3_store``'s prefix, behind the nodes' back."""
    return Bucket(moto_s3.raw_client(), BUCKET, s3_store.url.split("/", 3)[3])


@pytest.fixture
def file_store(tmp_path: Path) -> Store:
    root = tmp_path / "archive"
    root.mkdir()
    return Store(root.as_uri())
