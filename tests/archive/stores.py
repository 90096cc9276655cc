"""The stores the archive tests run against, and what the tests need to do behind an archive's
back (corrupt an object, race a writer) on each.

S3 is always a real HTTP server in its own process: `moto_server` (installed with the test
extras), and optionally `s3rver` (a Node.js S3 emulator that, unlike moto, ignores
`If-None-Match`, so it exercises the weaker HEAD-then-PUT path). Neither is a patched client.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from flotilla.node.archive import Archive, ArchiveSettings, open_archive
from flotilla.node.archive.filesystem import FileArchive

REGION = "us-east-1"
BUCKET = "flotilla-archive-tests"
# Dummy credentials: s3rver knows only this key pair; moto takes anything. (The test that
# checks credentials never leak sets its own, recognisable ones.)
ACCESS_KEY_ID = "S3RVER"
SECRET_ACCESS_KEY = "S3RVER"

MiB = 1 << 20
#: Small enough to make tests quick, big enough for S3's 5 MiB minimum part size.
TEST_SETTINGS = ArchiveSettings(
    max_attempts=2,
    connect_timeout=2.0,
    read_timeout=10.0,
    stream_attempts=2,
    retry_base_delay=0.01,
    multipart_threshold=5 * MiB,
    multipart_chunksize=5 * MiB,
)


def known_defect(request: Any, backend: Any, store: str, reason: str, *, strict=True) -> None:
    """Expect the calling test to fail on `store` because of a defect of that store."""
    if backend.name == store:
        request.applymarker(pytest.mark.xfail(strict=strict, reason=f"{store}: {reason}"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def aws_environment(tmp: Path) -> dict[str, str]:
    """Credentials for the emulators, and no shared config that could point elsewhere."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@dataclass
class S3Server:
    """An S3-compatible server process on loopback."""

    name: str
    endpoint: str
    process: subprocess.Popen
    honours_if_none_match: bool
    log_path: Path
    client: Any = field(default=None)

    def raw_client(self) -> Any:
        """A plain boto3 client, to act behind the archive's back."""
        if self.client is None:
            self.client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint, region_name=REGION,
                config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
            )
        return self.client

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _wait_for_http(endpoint: str, process: subprocess.Popen, log_path: Path, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{name} exited with {process.returncode}:\n{log_path.read_text()[-2000:]}"
            )
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (with an S3 error document): it is up
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{name} did not answer on {endpoint} within 30 s")


def moto_server_path() -> str | None:
    beside_python = Path(sys.executable).with_name("moto_server")
    return str(beside_python) if beside_python.exists() else shutil.which("moto_server")


def start_moto(tmp: Path) -> S3Server:
    binary = moto_server_path()
    assert binary is not None
    port = free_port()
    log_path = tmp / "moto_server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, "-H", "127.0.0.1", "-p", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    server = S3Server("moto", f"http://127.0.0.1:{port}", process, True, log_path)
    try:
        _wait_for_http(server.endpoint, process, log_path, "moto_server")
    except BaseException:
        server.stop()
        raise
    return server


def s3rver_path() -> str | None:
    """`$FLOTILLA_S3RVER` (the s3rver script, e.g. from `npm install s3rver`), or `s3rver` on
    PATH. Optional: the tests that use it skip without it."""
    return os.environ.get("FLOTILLA_S3RVER") or shutil.which("s3rver")


def start_s3rver(tmp: Path, binary: str) -> S3Server:
    port = free_port()
    log_path = tmp / "s3rver.log"
    data = tmp / "s3rver-data"
    data.mkdir()
    # s3rver 3.x builds continuation tokens with a cipher Node 17+ only has in its legacy
    # provider; signatures are not checked against our dummy credentials.
    env = {**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "-s",
             "--allow-mismatched-signatures"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )
    server = S3Server("s3rver", f"http://127.0.0.1:{port}", process, False, log_path)
    try:
        _wait_for_http(server.endpoint, process, log_path, "s3rver")
    except BaseException:
        server.stop()
        raise
    return server


class FileBackend:
    """`file://` archives under a test's tmp_path."""

    name = "file"
    honours_if_none_match = True  # os.link never overwrites

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "archive"
        self.url = self.root.as_uri()

    def open(self, settings: ArchiveSettings = TEST_SETTINGS) -> Archive:
        return open_archive(self.url, settings=settings)

    def overwrite(self, key: str, data: bytes, *, digest: str | None = None) -> None:
        """Replace an object's bytes behind the archive's back (keeping its recorded digest
        unless `digest` is given)."""
        path = self.root / key
        path.write_bytes(data)
        if digest is not None:
            path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")

    def drop_digest(self, key: str) -> None:
        path = self.root / key
        path.with_name(path.name + ".sha256").unlink()

    def write_behind(self, key: str, data: bytes) -> None:
        """Create an object as another writer would (a second archive on the same root)."""
        FileArchive(self.root, TEST_SETTINGS).put_bytes(key, data)

    def race_next_put(self, archive: Archive, key: str, data: bytes) -> None:
        """Make another writer create `key` just after `archive`'s next existence check."""
        original = archive._existing_digest  # type: ignore[attr-defined]
        state = {"armed": True}

        def check_then_lose(target, where):
            found = original(target, where)
            if state.pop("armed", False):
                self.write_behind(key, data)
            return found

        archive._existing_digest = check_then_lose  # type: ignore[attr-defined]

    def count_calls(self, archive: Archive) -> dict[str, int]:
        return {}


class S3Backend:
    """`s3://` archives on a running server, each test under its own prefix."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.name = server.name
        self.honours_if_none_match = server.honours_if_none_match
        self.prefix = f"t-{uuid.uuid4().hex[:12]}"
        self.url = f"s3://{BUCKET}/{self.prefix}"

    def open(self, settings: ArchiveSettings = TEST_SETTINGS) -> Archive:
        return open_archive(
            self.url, endpoint=self.server.endpoint, region=REGION, settings=settings
        )

    def overwrite(self, key: str, data: bytes, *, digest: str | None = None) -> None:
        """A raw put_object: without metadata (so no recorded digest) unless `digest`."""
        extra = {"Metadata": {"sha256": digest}} if digest is not None else {}
        self.server.raw_client().put_object(
            Bucket=BUCKET, Key=f"{self.prefix}/{key}", Body=data, **extra
        )

    def drop_digest(self, key: str) -> None:
        client = self.server.raw_client()
        full = f"{self.prefix}/{key}"
        body = client.get_object(Bucket=BUCKET, Key=full)["Body"].read()
        client.put_object(Bucket=BUCKET, Key=full, Body=body)

    def write_behind(self, key: str, data: bytes) -> None:
        import hashlib

        self.overwrite(key, data, digest=hashlib.sha256(data).hexdigest())

    def race_next_put(self, archive: Archive, key: str, data: bytes) -> None:
        """Another writer creates `key` right after `archive`'s HEAD found nothing."""
        events = archive.client.meta.events  # type: ignore[attr-defined]
        state = {"armed": True}

        def after_head(**_: Any) -> None:
            if state.pop("armed", False):
                self.write_behind(key, data)

        events.register("after-call.s3.HeadObject", after_head)

    def count_calls(self, archive: Archive) -> dict[str, int]:
        """Counts of the S3 calls the archive makes from now on, by operation."""
        counts: dict[str, int] = {}

        def count(model, **_: Any) -> None:
            counts[model.name] = counts.get(model.name, 0) + 1

        archive.client.meta.events.register("before-call.s3", count)  # type: ignore[attr-defined]
        return counts
