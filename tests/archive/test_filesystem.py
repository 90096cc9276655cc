"""What only the file:// backend has to get right: the states a crash can leave on disk."""

from __future__ import annotations

import hashlib
import os

import pytest
from flotilla.node.archive import ArchiveCorrupt, open_archive
from flotilla.node.archive.filesystem import FileArchive

from tests.archive.stores import TEST_SETTINGS


@pytest.fixture
def archive(tmp_path) -> FileArchive:
    return open_archive((tmp_path / "archive").as_uri(), settings=TEST_SETTINGS)


def test_objects_are_plain_files_with_sha256sum_sidecars(archive, tmp_path):
    archive.put_bytes("c1/segments/x.seg", b"bytes")
    folder = tmp_path / "archive" / "c1" / "segments"
    assert sorted(p.name for p in folder.iterdir()) == ["x.seg", "x.seg.sha256"]
    assert (folder / "x.seg.sha256").read_text() == (
        f"{hashlib.sha256(b'bytes').hexdigest()}  x.seg\n"
    )


def test_a_crash_between_link_and_sidecar_is_healed_by_the_retried_put(archive, tmp_path):
    archive.put_bytes("obj", b"data")
    (tmp_path / "archive" / "obj.sha256").unlink()  # as if the writer died right after link()
    assert archive.put_bytes("obj", b"data").sha256 == hashlib.sha256(b"data").hexdigest()
    assert archive.get_bytes("obj") == b"data"


def test_a_stale_sidecar_left_by_an_interrupted_delete_does_not_block_a_new_object(
    archive, tmp_path
):
    archive.put_bytes("obj", b"old")
    (tmp_path / "archive" / "obj").unlink()  # delete interrupted before the sidecar went
    archive.put_bytes("obj", b"new")
    assert archive.get_bytes("obj") == b"new"


def test_leftover_temporary_files_are_invisible(archive, tmp_path):
    archive.put_bytes("d/a", b"x")
    (tmp_path / "archive" / "d" / ".a.123.deadbeef.tmp").write_bytes(b"half")
    assert list(archive.list_keys("")) == ["d/a"]


def test_a_damaged_sidecar_is_reported_as_such(archive, tmp_path):
    archive.put_bytes("obj", b"data")
    (tmp_path / "archive" / "obj.sha256").write_text("garbage\n")
    with pytest.raises(ArchiveCorrupt, match="sidecar"):
        archive.get_bytes("obj")


def test_nothing_is_ever_written_through_an_existing_name(archive, tmp_path):
    archive.put_bytes("obj", b"data")
    inode = os.stat(tmp_path / "archive" / "obj").st_ino
    archive.put_bytes("obj", b"data")
    assert os.stat(tmp_path / "archive" / "obj").st_ino == inode


@pytest.mark.parametrize("url", ["file://relative/path", "file://otherhost/abs", "ftp://x/y"])
def test_urls_that_name_no_local_absolute_directory_are_refused(url):
    with pytest.raises(ValueError, match="archive URL"):
        open_archive(url)
