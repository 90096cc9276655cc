"""Archive URLs: what `--archive` and `--restore-from` accept (node/archive/urls.py)."""

from __future__ import annotations

import pytest
from flotilla.node.archive import ArchiveURL, open_archive, parse_archive_url


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("s3://bucket", ArchiveURL("s3", "bucket", "")),
        ("s3://bucket/", ArchiveURL("s3", "bucket", "")),
        ("s3://bucket/a/b/", ArchiveURL("s3", "bucket", "a/b")),
        ("file:///srv/archive", ArchiveURL("file", "/srv/archive")),
        ("file:///srv/with%20space/", ArchiveURL("file", "/srv/with space")),
        ("file://localhost/srv/a", ArchiveURL("file", "/srv/a")),
    ],
)
def test_valid_urls(url, parsed):
    assert parse_archive_url(url) == parsed


@pytest.mark.parametrize(
    "url", ["s3:///prefix-only", "s3://b/p?versionId=1", "s3://b/p#x", "gs://b/p", "/srv/a", ""]
)
def test_invalid_urls_say_what_is_accepted(url):
    with pytest.raises(ValueError, match="archive URL"):
        parse_archive_url(url)


def test_the_endpoint_must_be_http(aws_env):
    with pytest.raises(ValueError, match="http"):
        open_archive("s3://b/p", endpoint="minio:9000")


def test_a_file_archive_ignores_s3_options(tmp_path):
    archive = open_archive(tmp_path.as_uri(), endpoint="http://127.0.0.1:9", region="x")
    assert archive.url == tmp_path.as_uri()
