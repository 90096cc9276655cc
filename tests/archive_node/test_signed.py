"""A cluster that archives with ``--archive-signing-key-file`` (and ``--s3-sse``): every manifest
it writes carries a MAC, every object is encrypted at rest, and a restore with the key takes
the archive as it was written but refuses one that someone with write access to the bucket has
rewritten consistently (object, recorded checksum and manifest): exit 3, naming the manifest
and what to do, with nothing restored."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from flotilla.node import config
from flotilla.node.archive import ManifestKeys, SigningKey
from flotilla.node.archive.segments import decode_segment, encode_segment
from flotilla.node.consensus import EntryKind
from flotilla.node.main import main

from tests.archive_node.support import (
    FAST,
    Bucket,
    Store,
    Writer,
    assert_state,
    random_writes,
    wait_archived,
    wait_for,
)

REQUIRED = ["--name", "n1", "--data-dir", "d", "--listen-peer", "127.0.0.1:7001",
            "--listen-client", "127.0.0.1:7002"]


def key_file(tmp_path: Path, secret: bytes, name: str = "archive.key") -> Path:
    path = tmp_path / name
    path.write_bytes(secret)
    path.chmod(0o600)
    return path


def test_the_key_comes_from_a_file_flag_or_its_environment_variable(tmp_path):
    path = key_file(tmp_path, b"0123456789abcdef0123456789abcdef\n")
    expected = ManifestKeys((SigningKey.from_secret(b"0123456789abcdef0123456789abcdef"),))
    assert config.parse([*REQUIRED, "--archive-signing-key-file", str(path)],
                        env={}).archive_keys == expected
    assert config.parse(REQUIRED, env={"FLOTILLA_ARCHIVE_SIGNING_KEY_FILE": str(path)}
                        ).archive_keys == expected
    assert config.parse(REQUIRED, env={}).archive_keys is None
    old = key_file(tmp_path, b"o" * 16, "old.key")
    rotated = config.parse([*REQUIRED, "--archive-signing-key-file", f"{path},{old}"], env={})
    assert rotated.archive_keys.key_ids == (expected.key_ids[0],
                                            SigningKey.from_secret(b"o" * 16).key_id)
    sse = config.parse([*REQUIRED, "--s3-sse", "aws:kms", "--s3-sse-kms-key-id", "alias/a"],
                       env={}).s3_encryption
    assert (sse.mode, sse.kms_key_id) == ("aws:kms", "alias/a")


@pytest.mark.parametrize("flags, says", [
    (["--archive-signing-key-file", "{short}"], "holds 15 bytes; a manifest signing key needs "
                                                "at least 16"),
    (["--archive-signing-key-file", "{missing}"], "cannot read the signing key file"),
    (["--s3-sse", "aws:kms:dsse"], "--s3-sse must be AES256 or aws:kms"),
    (["--s3-sse-kms-key-id", "k"], "--s3-sse-kms-key-id goes with --s3-sse aws:kms"),
])
def test_a_bad_key_or_encryption_flag_exits_2_in_one_line(tmp_path, capsys, flags, says):
    short = key_file(tmp_path, b"x" * 15)
    argv = [flag.format(short=short, missing=tmp_path / "none") for flag in flags]
    assert main([*REQUIRED, *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flotilla node: ") and says in lines[0], lines


def forge(bucket: Bucket, cluster_id: str) -> str:
    """Rewrite the newest segment as no-ops, record its new SHA-256 with it, and rewrite the
    manifest in force in place to match, keeping its (now stale) MAC: every checksum agrees.
    Returns the manifest's key."""
    name, document = bucket.manifest(cluster_id)
    record = document["segments"][-1]
    key = f"{cluster_id}/{record['key']}"
    entries = decode_segment(bucket.get(key), cluster_id=cluster_id)
    forged = encode_segment(cluster_id, [replace(e, kind=EntryKind.NOOP, data=b"")
                                         for e in entries])
    digest = hashlib.sha256(forged).hexdigest()
    bucket.put(key, forged, metadata={"sha256": digest})
    record.update(sha256=digest, bytes=len(forged))
    data = json.dumps(document, indent=1).encode()
    bucket.put(name, data, metadata={"sha256": hashlib.sha256(data).hexdigest()})
    return name


@pytest.mark.timeout(150)
def test_a_signed_encrypted_archive_restores_and_a_consistent_rewrite_is_refused(
        local_cluster, s3_store: Store, bucket: Bucket, tmp_path):
    key = key_file(tmp_path, b"a-shared-secret-of-32-bytes-long")
    protected = ["--archive-signing-key-file", str(key), "--s3-sse", "AES256"]
    old = local_cluster(1, extra_args=[*s3_store.archive_flags(), *protected],
                        env=s3_store.env, **FAST)
    old_id = old.cluster_id
    url = old.nodes["n0"].url
    old.wait_leader()
    keys = [f"sg/{i:02d}" for i in range(10)]
    with Writer([url]) as writer:
        random_writes(writer, keys, 40, random.Random(5), delete_ratio=0.2)
        writes = list(writer.writes)
    wait_archived(old, "n0", writes[-1].index)
    old.nodes["n0"].kill()

    expected_id = SigningKey.from_secret(b"a-shared-secret-of-32-bytes-long").key_id
    for name in bucket.keys(f"{old_id}/manifests/"):
        assert json.loads(bucket.get(name))["mac"]["key_id"] == expected_id, name
    for name in bucket.keys(f"{old_id}/"):
        assert bucket.head(name).get("ServerSideEncryption") == "AES256", name

    restore = [*s3_store.restore_flags(), "--archive-signing-key-file", str(key)]
    good = local_cluster(1, cluster_id=f"ok-{uuid.uuid4().hex[:8]}", env=s3_store.env,
                         extra_args=restore, **FAST)
    good.wait_leader(timeout=60)
    assert_state(good.nodes["n0"].url, writes, None, keys, "sg/",
                 "the cluster restored from the signed archive")
    good.stop_all()

    manifest = forge(bucket, old_id)
    refused = local_cluster(1, cluster_id=f"no-{uuid.uuid4().hex[:8]}", env=s3_store.env,
                            extra_args=restore, **FAST)
    node = refused.nodes["n0"]
    wait_for(lambda: not node.running, 60, "the member to refuse the rewritten archive")
    log = node.log_tail(40)
    assert node.returncode == 3, f"exit code {node.returncode}, expected 3:\n{log}"
    last_line = [line for line in log.splitlines() if line.strip()][-1]
    assert manifest in last_line, f"the exit message does not name {manifest}: {last_line}"
    assert "does not verify with signing key" in last_line, last_line
    assert "restore from a copy you trust" in last_line, last_line
    assert not list(node.data_dir.glob("snap/*.snap")), "something was restored"
