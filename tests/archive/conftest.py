"""Fixtures of the archive tests.

`backend` runs a test once per store: a file:// archive in tmp_path, S3 on `moto_server`, and
S3 on `s3rver` where it is installed (`npm install s3rver`, then put it on PATH or point
FLOTILLA_S3RVER at node_modules/.bin/s3rver). The servers are started once per session as real
processes on a free loopback port and killed at the end; a missing server skips its runs with
the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.archive.stores import (
    BUCKET,
    FileBackend,
    S3Backend,
    S3Server,
    aws_environment,
    moto_server_path,
    s3rver_path,
    start_moto,
    start_s3rver,
)


@pytest.fixture(scope="session")
def aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Dummy AWS credentials for the whole session (boto3 reads them from the environment,
    exactly as a node does)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in aws_environment(tmp_path_factory.mktemp("aws")).items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        yield


def _serve(server: S3Server) -> Iterator[S3Server]:
    try:
        server.raw_client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto(aws_env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if moto_server_path() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    yield from _serve(start_moto(tmp_path_factory.mktemp("moto")))


@pytest.fixture(scope="session")
def s3rver(aws_env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    binary = s3rver_path()
    if binary is None:
        pytest.skip(
            "s3rver is not installed (optional: npm install s3rver, then put it on PATH or "
            "set FLOTILLA_S3RVER to node_modules/.bin/s3rver)"
        )
    yield from _serve(start_s3rver(tmp_path_factory.mktemp("s3rver"), binary))


# s3rver is optional: its runs exist only where it is installed (see the report header).
BACKENDS = ["file", "moto", *(["s3rver"] if s3rver_path() else [])]


def pytest_report_header(config: pytest.Config) -> str:
    found = s3rver_path()
    return f"archive tests: s3rver {'at ' + found if found else 'not installed (optional)'}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path):
    if request.param == "file":
        return FileBackend(tmp_path)
    return S3Backend(request.getfixturevalue(request.param))


@pytest.fixture
def archive(backend):
    opened = backend.open()
    yield opened
    opened.close()
