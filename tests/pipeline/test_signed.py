"""The pipeline on a signed archive (`--archive-signing-key-file`): snapshot-at verifies the
manifest it plans from and signs the one it publishes, so a restore with the key verifies it;
every job refuses, before Spark starts, a source whose manifest does not verify."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest
from flotilla.node.archive import (
    ManifestKeys,
    ManifestNotAuthentic,
    SigningKey,
    open_archive,
)
from flotilla.node.restore import settle
from flotilla.node.storage import PayloadReader
from flotilla.pipeline.snapshot_at import snapshot_at
from flotilla.pipeline.source import ArchiveRef

from tests.pipeline.archives import replayed_payload, write_archive
from tests.pipeline.test_snapshot_at import history

SECRET = b"pipeline-signing-key-0123456789"
KEY = ManifestKeys((SigningKey.from_secret(SECRET),))


def pipeline(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flotilla", "pipeline", *argv],
                          capture_output=True, text=True, timeout=120)


def restored_payload(url: str, cluster_id: str, keys: ManifestKeys) -> bytes:
    """What the node's restore, with the key, rebuilds from `cluster_id`: its settle and its
    prepared plan, verified."""
    archive = open_archive(url)
    try:
        source = settle(archive, cluster_id=cluster_id, excluding=None, keys=keys)
        with tempfile.TemporaryDirectory() as work:
            prepared = source.cluster.prepare_restore(work, source.index)
            assert not prepared.plan.segments
            with PayloadReader(prepared.snapshot_path) as payload:
                return payload.read()
    finally:
        archive.close()


def test_snapshot_at_signs_what_it_publishes_and_a_restore_with_the_key_verifies_it(
        spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(4, 80), snapshot_at=[30], keys=KEY)
    index = len(log) - 3
    result = snapshot_at(spark, ArchiveRef(url, "old", keys=KEY), index, sequential=True)

    root = tmp_path / "archive" / result.cluster_id / "manifests"
    [written] = sorted(root.glob("*.json"))
    assert json.loads(written.read_bytes())["mac"]["key_id"] == KEY.key_ids[0]
    assert restored_payload(url, result.cluster_id, KEY) == replayed_payload(url, "old", index)

    other = ManifestKeys((SigningKey.from_secret(b"another-key-entirely-0123"),))
    with pytest.raises(ManifestNotAuthentic, match=KEY.key_ids[0]):
        restored_payload(url, result.cluster_id, other)


@pytest.mark.parametrize("job", [["snapshot-at", "--index", "5"], ["compact"],
                                 ["export", "--to", "{tmp}/out"]])
def test_every_job_refuses_a_source_that_does_not_verify_before_spark_starts(tmp_path, job):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(5, 20))  # unsigned
    key = tmp_path / "key"
    key.write_bytes(SECRET)
    argv = [word.format(tmp=tmp_path) for word in job]
    done = pipeline(*argv, "--archive", url, "--archive-signing-key-file", str(key),
                    "--dry-run")
    assert done.returncode == 1, done.stderr
    assert "carries no MAC" in done.stderr and "manifests/" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    # The same archive, signed with that key, plans.
    signed = (tmp_path / "signed").as_uri()
    write_archive(signed, "old", history(5, 20), keys=KEY)
    planned = pipeline(*argv, "--archive", signed, "--archive-signing-key-file", str(key),
                       "--dry-run")
    assert planned.returncode == 0, planned.stderr


@pytest.mark.parametrize(("flags", "says"), [
    (["--archive-signing-key-file", "{short}"], "holds 9 bytes"),
    (["--s3-sse", "AES128"], "--s3-sse must be AES256 or aws:kms"),
    (["--s3-sse-kms-key-id", "k"], "goes with --s3-sse aws:kms"),
])
def test_bad_key_or_encryption_flags_exit_2_in_one_line(tmp_path, flags, says):
    short = tmp_path / "short"
    short.write_bytes(b"too-short")
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(6, 5))
    done = pipeline("compact", "--archive", url, "--dry-run",
                    *[flag.format(short=short) for flag in flags])
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_keys_never_travel_into_a_task():
    import pickle

    from flotilla.node.archive import S3Encryption

    ref = ArchiveRef("s3://b/p", "old", "http://e", "r", S3Encryption("AES256"), keys=KEY)
    shipped = pickle.loads(pickle.dumps(ref))
    assert shipped == ref and shipped.encryption == S3Encryption("AES256")
    assert shipped.keys is None and SECRET not in pickle.dumps(ref)
    archive = shipped.open()  # what a task opens writes encrypted
    try:
        assert archive.encryption == S3Encryption("AES256")
    finally:
        archive.close()
