"""Signed manifests (node/archive/signing.py) on every backend: with a key, every manifest a
writer publishes carries an HMAC over its content, and a reader with the key refuses one that
does not verify, even after someone with write access to the store rewrote an object, its
recorded checksum and the manifest consistently. Without a key nothing changes."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from flotilla.node.archive import (
    ClusterArchive,
    Manifest,
    ManifestKeys,
    ManifestNotAuthentic,
    SigningKey,
)
from flotilla.node.archive.layout import manifest_key
from flotilla.node.archive.segments import encode_segment
from flotilla.node.archive.signing import MIN_KEY_BYTES, read_key_file
from flotilla.node.consensus.types import Entry, EntryKind

from tests.archive.test_cluster import entries, make_snapshot

KEY = ManifestKeys((SigningKey.from_secret(b"k" * 32),))
OLD_KEY = ManifestKeys((SigningKey.from_secret(b"o" * 32),))


def signed_cluster(archive, keys: ManifestKeys | None = KEY) -> ClusterArchive:
    return ClusterArchive(archive, "c1", keys=keys)


def ship(cluster: ClusterArchive, tmp_path: Path) -> Manifest:
    cluster.upload_segment(entries(1, 10))
    cluster.publish()
    cluster.upload_snapshot(*make_snapshot(tmp_path, 10))
    cluster.upload_segment(entries(11, 20))
    return cluster.publish()


def stored_manifest(archive, seq: int) -> dict:
    return json.loads(archive.get_bytes("c1/" + manifest_key(seq)))


def rewrite_consistently(backend, archive, manifest: Manifest, mac: dict | None) -> None:
    """What someone with write access but no key can do: replace the newest segment with other
    entries, record the new bytes' SHA-256 with the object, and rewrite the manifest in force
    in place, its record of that segment updated, with `mac` (None: without one)."""
    segment = manifest.segments[-1]
    forged = encode_segment("c1", [Entry(i, 2, EntryKind.NORMAL, b"put evil", 0)
                                   for i in range(segment.first, segment.last + 1)])
    digest = hashlib.sha256(forged).hexdigest()
    backend.overwrite("c1/" + segment.key, forged, digest=digest)
    document = json.loads(manifest.to_json())
    document["segments"][-1].update(sha256=digest, bytes=len(forged))
    if mac is not None:
        document["mac"] = mac
    data = json.dumps(document, indent=1).encode()
    backend.overwrite("c1/" + manifest_key(manifest.seq), data,
                      digest=hashlib.sha256(data).hexdigest())


def test_every_manifest_a_writer_with_a_key_publishes_carries_a_mac_by_that_key(
        archive, tmp_path):
    manifest = ship(signed_cluster(archive), tmp_path)
    for seq in (1, manifest.seq):
        mac = stored_manifest(archive, seq)["mac"]
        assert mac["alg"] == "HMAC-SHA256"
        assert mac["key_id"] == KEY.keys[0].key_id
        assert len(mac["value"]) == 64
    assert signed_cluster(archive).manifest() == manifest
    # Readers without a key read signed manifests as before.
    assert ClusterArchive(archive, "c1").manifest() == manifest


@pytest.mark.parametrize("mac", ["kept", "removed"])
def test_a_consistent_rewrite_without_the_key_is_refused(backend, archive, tmp_path, mac):
    manifest = ship(signed_cluster(archive), tmp_path)
    stale = stored_manifest(archive, manifest.seq)["mac"]
    rewrite_consistently(backend, archive, manifest, stale if mac == "kept" else None)

    # Every checksum matches: a reader without the key takes the forgery.
    forged = ClusterArchive(archive, "c1").prepare_restore(tmp_path / "w0", 20)
    assert {e.data for e in forged.entries()} >= {b"put evil"}

    reader = signed_cluster(archive)
    said = "does not verify with signing key" if mac == "kept" else "carries no MAC"
    with pytest.raises(ManifestNotAuthentic, match=said) as refused:
        reader.prepare_restore(tmp_path / "w1", 20)
    assert manifest_key(manifest.seq) in str(refused.value)
    assert "restore from a copy you trust" in str(refused.value)


def test_an_unsigned_newest_manifest_stops_a_reader_with_a_key_instead_of_falling_back(
        archive, tmp_path, caplog):
    cluster = signed_cluster(archive)
    ship(cluster, tmp_path)
    unsigned = ClusterArchive(archive, "c1")  # a writer without the key publishes next
    unsigned.upload_segment(entries(21, 30))
    newest = unsigned.publish()
    with caplog.at_level(logging.WARNING), pytest.raises(ManifestNotAuthentic) as refused:
        signed_cluster(archive).manifest()
    assert manifest_key(newest.seq) in str(refused.value)
    assert "falling back" not in caplog.text
    # ...nor does a writer with the key publish on top of it.
    cluster.upload_segment(entries(21, 30))
    with pytest.raises(ManifestNotAuthentic):
        cluster.publish()


def test_rotation_new_key_signs_and_old_keys_still_verify(archive, tmp_path):
    old = ship(signed_cluster(archive, OLD_KEY), tmp_path)
    with pytest.raises(ManifestNotAuthentic, match=OLD_KEY.keys[0].key_id) as refused:
        signed_cluster(archive, KEY).manifest()
    assert "list the old key files after the new one" in str(refused.value)

    rotated = ManifestKeys(KEY.keys + OLD_KEY.keys)
    cluster = signed_cluster(archive, rotated)
    assert cluster.manifest() == old
    cluster.upload_segment(entries(21, 30))
    newest = cluster.publish()
    assert stored_manifest(archive, newest.seq)["mac"]["key_id"] == KEY.keys[0].key_id
    assert signed_cluster(archive, KEY).manifest() == newest


def test_the_mac_covers_the_content_not_the_layout_of_the_json():
    manifest = Manifest.create("c1", 7, "2024-01-01T00:00:00Z")
    document = json.loads(manifest.to_json(KEY))
    compact = json.dumps(document, separators=(",", ":")).encode()
    assert Manifest.from_json(compact, keys=KEY) == manifest
    for field, value in (("seq", 8), ("cluster_id", "c2"), ("retention_floor", 3)):
        changed = {**document, field: value}
        with pytest.raises(ManifestNotAuthentic, match="does not verify"):
            Manifest.from_json(json.dumps(changed).encode(), name="m", keys=KEY)
    for value in ("\u00e9" * 64, "\ud800", 7):
        garbled = {**document, "mac": {**document["mac"], "value": value}}
        with pytest.raises(ManifestNotAuthentic, match="does not verify"):
            Manifest.from_json(json.dumps(garbled).encode(), name="m", keys=KEY)


def test_keys_shorter_than_16_bytes_are_refused_and_a_file_s_line_break_is_not_key(tmp_path):
    with pytest.raises(ValueError, match=f"at least {MIN_KEY_BYTES}"):
        SigningKey.from_secret(b"x" * (MIN_KEY_BYTES - 1))
    path = tmp_path / "key"
    path.write_bytes(b"0123456789abcdef\n")
    assert read_key_file(path) == SigningKey.from_secret(b"0123456789abcdef")
    path.write_bytes(b"0123456789abcde\n")
    with pytest.raises(ValueError, match=f"{path} holds 15 bytes"):
        read_key_file(path)
    with pytest.raises(ValueError, match="cannot read the signing key file"):
        read_key_file(tmp_path / "missing")


def test_the_key_id_names_a_key_without_revealing_it():
    key = SigningKey.from_secret(b"s3cret-s3cret-s3cret")
    assert key.key_id == SigningKey.from_secret(b"s3cret-s3cret-s3cret").key_id
    assert key.key_id != SigningKey.from_secret(b"s3cret-s3cret-s3creT").key_id
    assert "s3cret" not in key.key_id and "s3cret" not in repr(key)

