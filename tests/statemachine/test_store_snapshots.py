"""The member's snapshots of any machine: written into the snapshot store by each method of
`start_snapshot` (a forked child, the overlay writer thread, the caller) while the machine keeps
applying, published as the storage layer's file, and restored only into the same kind."""

from __future__ import annotations

import asyncio
import io

import pytest
from flotilla.node.consensus import Membership, SnapshotMeta
from flotilla.node.statemachine import KVStateMachine, SnapshotError, encode_put, start_snapshot
from flotilla.node.statemachine.factory import MachineFactory, MachineMismatch
from flotilla.node.statemachine.store import StoreTarget, method_for, snapshot_into_store
from flotilla.node.storage import DataDirError, SnapshotStore

from flotilla.examples.counter import Counter
from tests.statemachine.sm_workloads import finish

META = SnapshotMeta(7, 2, Membership(voters=frozenset({"a"})), 1234)
COUNTER = "flotilla.examples.counter:Counter"


def payload(machine) -> bytes:
    out = io.BytesIO()
    machine.write_snapshot(out)
    return out.getvalue()


def test_the_method_is_overlay_for_a_machine_that_freezes_else_fork():
    assert method_for(KVStateMachine()) == "overlay"
    assert method_for(Counter()) == "auto"


@pytest.mark.parametrize("method", ["fork", "overlay", "sync"])
def test_each_method_writes_the_moment_it_started_into_the_store(tmp_path, method):
    store = SnapshotStore(tmp_path / "snap", fsync=False)
    kv = KVStateMachine()
    for i in range(1, 200):
        kv.apply(i, encode_put(f"k{i}", b"v" * 50, ts=i))
    expected = payload(kv)
    target = StoreTarget(store.begin(META, kv.kind))
    job = start_snapshot(kv, target, method=method)
    kv.apply(500, encode_put("later", b"x", ts=500))  # after the moment: not in the snapshot
    assert finish(job).method == method
    path = target.publish()
    stored = store.latest()
    assert stored is not None and stored.path == path and stored.kind == "kv"
    with store.open_payload(path) as reader:
        assert reader.read() == expected


def test_snapshot_into_store_forks_for_a_counter_and_keeps_applying(tmp_path):
    store = SnapshotStore(tmp_path / "snap", fsync=False)
    counter = Counter()
    counter.apply(1, b"41")

    async def run():
        task = asyncio.create_task(snapshot_into_store(store, META, counter))
        await asyncio.sleep(0)  # the moment is taken before the first await returns
        counter.apply(2, b"1")
        return await task

    path = asyncio.run(run())
    factory = MachineFactory(COUNTER)
    with store.open_payload(path) as reader:
        assert factory.restored(reader).total == 41
    assert counter.total == 42


def test_a_failed_snapshot_leaves_nothing_and_the_store_free(tmp_path):
    class Failing(Counter):
        def write_snapshot(self, stream):
            stream.write(b"half")
            raise OSError("disk said no")

    store = SnapshotStore(tmp_path / "snap", fsync=False)
    with pytest.raises(SnapshotError, match="disk said no"):
        asyncio.run(snapshot_into_store(store, META, Failing()))
    assert list((tmp_path / "snap").iterdir()) == []
    asyncio.run(snapshot_into_store(store, META, Counter()))  # the store takes the next one
    assert store.latest() is not None


def test_a_snapshot_of_another_kind_is_refused_naming_both(tmp_path):
    store = SnapshotStore(tmp_path / "snap", fsync=False)
    path = store.save(META, "kv", KVStateMachine().write_snapshot)
    with store.open_payload(path) as reader, pytest.raises(MachineMismatch) as refused:
        MachineFactory(COUNTER).restored(reader)
    assert isinstance(refused.value, DataDirError)  # exit 3 at start
    said = str(refused.value)
    assert "a snapshot of the 'kv' state machine" in said and COUNTER in said


def test_a_data_dir_records_its_machine_and_refuses_another(tmp_path):
    MachineFactory(COUNTER).check_data_dir(tmp_path, fsync=False)
    MachineFactory(COUNTER).check_data_dir(tmp_path, fsync=False)
    with pytest.raises(MachineMismatch, match="holds the state of a 'counter' state machine, "
                                              "but this member runs kv"):
        MachineFactory("kv").check_data_dir(tmp_path, fsync=False)
    (tmp_path / "state-machine.json").write_text("{nope")
    with pytest.raises(DataDirError, match="unreadable"):
        MachineFactory("kv").check_data_dir(tmp_path, fsync=False)
