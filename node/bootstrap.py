"""Opening a member's data dir: what the runtime starts from.

Lock the dir, restore it from the archive if asked (before it holds anything), bootstrap a new
cluster's first configuration, recover the log and the newest snapshot that verifies, and build
the consensus core on them. Every refusal is a `StorageError` (exit 3) naming the file, or
`restore.OutsideArchive` (exit 4), with nothing written.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flotilla.node.consensus import Membership, RaftCore, Settings, SnapshotMeta
from flotilla.node.statemachine import StateMachine
from flotilla.node.statemachine.factory import MachineFactory
from flotilla.node.storage import (
    DataDir,
    DiskStorage,
    SnapshotStore,
    StorageError,
    StoredSnapshot,
    lock_data_dir,
    read_admission,
    write_admission,
)
from flotilla.node.storage.fsutil import make_private, write_atomic

from . import restore
from .config import MIN_TOKEN_BYTES, NodeConfig, new_admin_token

log = logging.getLogger(__name__)

#: Where a member started without --admin-token keeps the token it generated (0600).
ADMIN_TOKEN_FILE = "admin-token"


def admin_token_in(path: Path) -> str:
    """The token in `path`, made (32 random bytes, URL-safe) the first time, or when a crash
    left the file empty. A file holding a token too short to use is refused (StorageError),
    never replaced: someone wrote it, and would find their token silently gone."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    size = len(token.encode("utf-8", "surrogateescape"))
    if size >= MIN_TOKEN_BYTES:
        return token
    if token:
        raise StorageError(f"{path} holds an admin token of {size} bytes, under "
                           f"{MIN_TOKEN_BYTES}: remove the file (a new token is generated "
                           "there) or give --admin-token")
    token = new_admin_token()
    write_atomic(path, (token + "\n").encode())  # 0600
    return token


def wall_clock_ms() -> int:
    """The time a leader stamps on the entries it appends (Settings.wall_clock_ms)."""
    return time.time_ns() // 1_000_000


@dataclass
class Opened:
    """A member's data dir, opened and recovered: everything the runtime starts from."""

    cfg: NodeConfig  # with the admin token filled in
    lock: Any
    datadir: DataDir
    storage: DiskStorage
    store: SnapshotStore
    core: RaftCore
    machines: MachineFactory  # --state-machine
    machine: StateMachine
    latest: StoredSnapshot | None
    admin_token_file: Path | None  # the generated token's file, when none was given


def open_member(cfg: NodeConfig) -> Opened:
    """Lock the data dir, open it and recover; raises StorageError (exit 3) for a data dir
    it won't use, another live process's included, and restore.OutsideArchive (exit 4) for
    a restore target the archive cannot give, with nothing written."""
    # Before anything reads or writes the dir: a second process must not even bootstrap.
    lock = lock_data_dir(cfg.data_dir, fsync=cfg.fsync)
    try:
        # A restore's target is settled before the data dir holds anything, so a refused
        # one leaves the dir as empty as it was.
        source = (restore.open_source(cfg)
                  if restore.wanted(Path(cfg.data_dir), cfg) else None)
        try:
            return _open_locked(cfg, lock, source)
        finally:
            if source is not None:
                source.close()
    except BaseException:
        lock.release()
        raise


def _open_locked(cfg: NodeConfig, lock: Any, source: restore.Source | None) -> Opened:
    datadir = DataDir.open(cfg.data_dir, cluster_id=cfg.cluster_id, member_name=cfg.name,
                           fsync=cfg.fsync)
    token_file = None
    if cfg.admin_token is None:  # the admin API always needs a token
        token_file = datadir.path / ADMIN_TOKEN_FILE
        cfg = replace(cfg, admin_token=admin_token_in(token_file))
    storage = DiskStorage(cfg.data_dir, cluster_id=cfg.cluster_id, fsync=cfg.fsync)
    if make_private(datadir.path):  # only once storage found nothing to refuse
        log.info("closed %s to other users (mode 0700)", datadir.path)
    store = SnapshotStore(datadir.snapshot_dir, fsync=cfg.fsync)
    machines = MachineFactory(cfg.state_machine)
    recovered = storage.recover()
    membership = Membership(voters=frozenset(cfg.initial_cluster),
                            addresses=tuple(sorted(cfg.initial_cluster.items())))
    interrupted = restore.pending(datadir.path)
    if interrupted and not cfg.restore_from:
        raise restore.refuse_interrupted(datadir.path)
    if (datadir.created and cfg.initial_cluster_state == "new") or interrupted:
        if cfg.restore_from:
            assert source is not None, "restore.wanted() disagrees with the data dir"
            restore.mark(datadir.path, cfg)
            restore.restore(source, datadir.path, store, storage, membership, machines)
        else:
            storage.install_snapshot(SnapshotMeta(0, 0, membership))
        recovered = storage.recover()
    machine = machines.new()
    latest = None
    found = store.load_latest(machines.restored)  # one read, checked as it goes
    if found is not None:
        latest, machine = found
        if latest.meta.index > recovered.snapshot.index:
            # A crash came between making the snapshot durable and moving the log past it.
            storage.install_snapshot(latest.meta)
            recovered = storage.recover()
        elif latest.meta.index < recovered.snapshot.index:
            raise StorageError(
                f"{latest.path}: the newest snapshot that verifies is at index "
                f"{latest.meta.index}, but the log starts after {recovered.snapshot.index}. "
                "Remove the data dir and re-add this member as a learner"
            )
    elif recovered.snapshot.index > 0:
        raise StorageError(
            f"{cfg.data_dir}: the log starts after index {recovered.snapshot.index} but no "
            "snapshot file covers it. Remove the data dir and re-add this member as a learner"
        )
    machines.check_data_dir(datadir.path, fsync=cfg.fsync)  # once its state is known
    settings = Settings(
        rng=random.Random(),  # a member's own timeouts need no reproducibility
        election_ticks=cfg.election_ticks,
        heartbeat_ticks=1,
        wall_clock_ms=wall_clock_ms,
        lazy_commit=True,
    )
    core = RaftCore(cfg.name, settings, recovered)
    # A member that starts empty to be added (`existing`) votes only once the cluster is
    # known to count it as new: if its disk was lost, it may still count it as a voter.
    admission = read_admission(datadir.path)
    if admission is None and datadir.created and cfg.initial_cluster_state == \
            "existing" and not interrupted:
        core.await_admission()
        write_admission(datadir.path, core.admission, fsync=cfg.fsync)
    elif admission is not None:
        core.await_admission(admission)
    return Opened(cfg, lock, datadir, storage, store, core, machines, machine, latest,
                  token_file)
