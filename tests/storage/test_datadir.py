"""The data dir's identity: created once, then every start must be the same member of the same
cluster, or the dir is refused with a message that says what to do."""

from __future__ import annotations

import json
import os

import pytest
from flotilla.node.storage import (
    CorruptDataError,
    DataDir,
    DataDirError,
    DataDirInUse,
    DiskStorage,
    lock_data_dir,
)


def test_the_first_start_creates_the_identity_and_later_starts_keep_it(tmp_path):
    first = DataDir.open(tmp_path / "d", cluster_id="c1", member_name="n1")
    assert first.created
    assert (first.identity.cluster_id, first.identity.member_name) == ("c1", "n1")
    assert len(first.identity.member_uid) == 32
    again = DataDir.open(tmp_path / "d", cluster_id="c1", member_name="n1")
    assert not again.created
    assert again.identity == first.identity
    document = json.loads((tmp_path / "d" / "identity.json").read_text())
    assert document["member_uid"] == first.identity.member_uid


def test_each_new_data_dir_gets_its_own_uid(tmp_path):
    one = DataDir.open(tmp_path / "a", cluster_id="c1", member_name="n1")
    two = DataDir.open(tmp_path / "b", cluster_id="c1", member_name="n1")
    assert one.identity.member_uid != two.identity.member_uid


def test_another_clusters_data_dir_is_refused(tmp_path):
    DataDir.open(tmp_path, cluster_id="prod", member_name="n1")
    with pytest.raises(DataDirError) as caught:
        DataDir.open(tmp_path, cluster_id="staging", member_name="n1")
    message = str(caught.value)
    assert "'prod'" in message and "'staging'" in message and str(tmp_path) in message
    assert "--cluster-id" in message


def test_another_members_data_dir_is_refused(tmp_path):
    DataDir.open(tmp_path, cluster_id="prod", member_name="n1")
    with pytest.raises(DataDirError, match=r"'n1'.*not to 'n2'"):
        DataDir.open(tmp_path, cluster_id="prod", member_name="n2")


def test_a_dir_with_files_but_no_identity_is_refused(tmp_path):
    (tmp_path / "something").write_text("not ours")
    with pytest.raises(DataDirError, match=r"no identity\.json"):
        DataDir.open(tmp_path, cluster_id="prod", member_name="n1")


def test_a_damaged_identity_file_is_corrupt_data(tmp_path):
    DataDir.open(tmp_path, cluster_id="prod", member_name="n1")
    (tmp_path / "identity.json").write_text('{"format": 1, "cluster_id": "pr')
    with pytest.raises(CorruptDataError) as caught:
        DataDir.open(tmp_path, cluster_id="prod", member_name="n1")
    assert caught.value.path == str(tmp_path / "identity.json")


def test_the_log_lives_inside_an_opened_data_dir(tmp_path):
    data_dir = DataDir.open(tmp_path, cluster_id="prod", member_name="n1")
    log = DiskStorage(data_dir.path, cluster_id=data_dir.identity.cluster_id)
    log.close()
    assert not DataDir.open(tmp_path, cluster_id="prod", member_name="n1").created
    # The hard state exists from the first open on, before any entry: a log without one is
    # then always a lost file, never a member that had not voted yet.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hardstate", "identity.json", "wal"]


def test_a_held_data_dir_is_refused_naming_the_holder_until_released(tmp_path):
    held = lock_data_dir(tmp_path / "d")
    with pytest.raises(DataDirInUse) as caught:
        lock_data_dir(tmp_path / "d")  # flock is per open file: this process counts as another
    assert caught.value.holder == os.getpid()
    assert str(caught.value) == (f"{tmp_path / 'd'} is in use by another flotilla node "
                                 f"(pid {os.getpid()}); stop it first")
    held.release()
    lock_data_dir(tmp_path / "d").release()


def test_the_lock_file_does_not_make_an_empty_data_dir_look_used(tmp_path):
    held = lock_data_dir(tmp_path / "d")
    try:
        assert DataDir.open(tmp_path / "d", cluster_id="c1", member_name="n1").created
    finally:
        held.release()
