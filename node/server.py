"""The member runtime: one asyncio task owns the consensus core and carries out its batches.

Inputs (peer messages, proposals, reads, ticks) only queue and wake the loop; the loop steps
them all into the core, then carries out each Ready in the order `Ready` documents:
send the leader's messages at once, append and fsync (in a worker thread, one fsync for the
whole batch: group commit), send the messages that needed the fsync, apply committed entries
and answer their clients, answer reads, advance. Everything that arrives during an fsync is
batched into the next one, so throughput grows with load instead of queueing behind the disk.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flotilla.node.archive import ArchiveError, ClusterArchive, SnapshotRecord, open_archive
from flotilla.node.consensus import (
    FENCED,
    Entry,
    EntryKind,
    Membership,
    MembershipChangeInProgress,
    Message,
    ProposalError,
    RaftCore,
    Ready,
    Role,
    Settings,
    SnapshotMeta,
)
from flotilla.node.statemachine import StateMachine
from flotilla.node.statemachine.factory import MachineFactory
from flotilla.node.statemachine.store import snapshot_into_store
from flotilla.node.storage import (
    DataDir,
    DiskStorage,
    SnapshotStore,
    StorageError,
    StoredSnapshot,
    free_bytes,
    lock_data_dir,
    read_admission,
    write_admission,
)
from flotilla.node.storage.fsutil import make_private, write_atomic
from flotilla.node.storage.space import disk_full

from . import restore
from .alarms import CHECK_INTERVAL, SpaceAlarm
from .archiver import NODE_ARCHIVE_SETTINGS, Archiver
from .config import MIN_TOKEN_BYTES, NodeConfig
from .metrics import Metrics
from .tls import NodeContexts
from .transport import (
    CONFIGURED,
    MEMBERSHIP,
    SNAPSHOT_KEY_HEADER,
    SNAPSHOT_SHA_HEADER,
    SNAPSHOT_SIZE_HEADER,
    PeerTransport,
)

log = logging.getLogger(__name__)


class Unavailable(Exception):
    """The request cannot be served by this member now (no leader, leadership lost)."""


class Overloaded(Unavailable):
    """Too many writes are already waiting: back off for a while (503, code "overloaded")."""


# Back-pressure: a leader holds at most this many unanswered writes (or bytes of them). When
# followers or the disk fall behind, further writes get 503 + Retry-After at once instead of
# queueing without bound in memory; clients back off and retry.
MAX_PENDING_PROPOSALS = 8192
MAX_PENDING_BYTES = 64 << 20


@dataclass
class _Proposal:
    term: int
    future: asyncio.Future
    size: int


def wall_clock_ms() -> int:
    """The time a leader stamps on the entries it appends (Settings.wall_clock_ms)."""
    return time.time_ns() // 1_000_000


def _checked_machine(machines: MachineFactory, open_payload: Callable[[], AbstractContextManager],
                     what: str) -> StateMachine:
    """A fresh machine restored from the payload `open_payload()` gives (call it in a worker
    thread: it reads the whole file): a snapshot that came from elsewhere is checked this way
    before it replaces anything. SnapshotRefused when it does not restore (whatever a
    malformed payload makes the machine raise, or a snapshot of another kind of machine)."""
    try:
        with open_payload() as payload:
            return machines.restored(payload)
    except Exception as exc:
        raise SnapshotRefused(f"{what} does not restore: {exc.__class__.__name__}: "
                              f"{str(exc)[:200]}") from None


async def _wait_until(done: Callable[[], bool], event: asyncio.Event, timeout: float) -> bool:
    """Wait until `done()`, looking again each time `event` is set, for at most `timeout` s.
    Returns `done()`."""
    deadline = time.monotonic() + timeout
    while not done():
        event.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return done()
        try:
            async with asyncio.timeout(left):
                await event.wait()
        except TimeoutError:
            return done()
    return True


#: How long a requested snapshot waits for one being written before it is turned away.
SNAPSHOT_WAIT = 30.0


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
    token = secrets.token_urlsafe(32)
    write_atomic(path, (token + "\n").encode())  # 0600
    return token


class SnapshotRefused(ValueError):
    """A snapshot a peer sent does not restore; nothing was replaced."""


class NodeServer:
    def __init__(self, cfg: NodeConfig, contexts: NodeContexts | None = None) -> None:
        self.cfg = cfg
        self.tls = contexts if contexts is not None else NodeContexts()
        self.name = cfg.name
        self.metrics = Metrics()
        self.space = SpaceAlarm(cfg.data_dir, cfg.quota_free_bytes, self.metrics)
        self._inbox: list[Message] = []
        self._client_urls_learned = asyncio.Event()  # set when the configuration gives some
        self._heard_clients: dict[str, str] = {}  # leader: client URLs members reported
        # A received snapshot's file and the machine restored from it when it arrived.
        self._verified_machine: tuple[Path, StateMachine] | None = None
        self.machines = MachineFactory(cfg.state_machine)  # --state-machine
        self._proposals: dict[int, _Proposal] = {}
        self._pending_bytes = 0
        self._read_ids = itertools.count(1)
        self._reads: dict[int, asyncio.Future] = {}
        # Reads still waiting for a read index, and when it was last asked for.
        self._unanswered_reads: dict[int, float] = {}
        # Futures resolved with the applied index once it reaches theirs (reads, admin waits).
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._wakeup = asyncio.Event()
        self._stopping = False
        # Set when the loop that owns the core died: the member must stop, not linger.
        self.fatal: BaseException | None = None
        self.dead = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._snapshotting = False
        self._snapshot_idle = asyncio.Event()  # set whenever a snapshot finishes
        self._background: set[asyncio.Task] = set()
        self._log_bytes_since_snapshot = 0
        self._entries_since_snapshot = 0
        # The newest snapshot file, verified once when it was written, received or loaded at
        # start: it is never looked for again per request.
        self._snapshot: StoredSnapshot | None = None
        self._snapshot_bytes = 0
        self._snapshot_sources: dict[Path, str] = {}  # received files fetched from the archive
        self.applied = 0
        # Set by `open` when no --admin-token was given: the file holding the generated one.
        self.admin_token_file: Path | None = None

    # --- start-up -------------------------------------------------------------------------

    def open(self) -> None:
        """Lock the data dir, open it and recover; raises StorageError (exit 3) for a data dir
        it won't use, another live process's included, and restore.OutsideArchive (exit 4) for
        a restore target the archive cannot give, with nothing written."""
        # Before anything reads or writes the dir: a second process must not even bootstrap.
        self._lock = lock_data_dir(self.cfg.data_dir, fsync=self.cfg.fsync)
        try:
            # A restore's target is settled before the data dir holds anything, so a refused
            # one leaves the dir as empty as it was.
            source = (restore.open_source(self.cfg)
                      if restore.wanted(Path(self.cfg.data_dir), self.cfg) else None)
            try:
                self._open_locked(source)
            finally:
                if source is not None:
                    source.close()
        except BaseException:
            self._lock.release()
            raise

    def _open_locked(self, source: restore.Source | None) -> None:
        cfg = self.cfg
        self.datadir = DataDir.open(cfg.data_dir, cluster_id=cfg.cluster_id,
                                    member_name=cfg.name, fsync=cfg.fsync)
        if cfg.admin_token is None:  # the admin API always needs a token
            self.admin_token_file = self.datadir.path / ADMIN_TOKEN_FILE
            self.cfg = cfg = replace(cfg, admin_token=admin_token_in(self.admin_token_file))
        self.storage = DiskStorage(cfg.data_dir, cluster_id=cfg.cluster_id, fsync=cfg.fsync)
        if make_private(self.datadir.path):  # only once storage found nothing to refuse
            log.info("closed %s to other users (mode 0700)", self.datadir.path)
        self.snapshots = SnapshotStore(self.datadir.snapshot_dir, fsync=cfg.fsync)
        recovered = self.storage.recover()
        membership = Membership(voters=frozenset(cfg.initial_cluster),
                                addresses=tuple(sorted(cfg.initial_cluster.items())))
        interrupted = restore.pending(self.datadir.path)
        if interrupted and not cfg.restore_from:
            raise restore.refuse_interrupted(self.datadir.path)
        if (self.datadir.created and cfg.initial_cluster_state == "new") or interrupted:
            if cfg.restore_from:
                assert source is not None, "restore.wanted() disagrees with the data dir"
                restore.mark(self.datadir.path, cfg)
                restore.restore(source, self.datadir.path, self.snapshots, self.storage,
                                membership, self.machines)
            else:
                self.storage.install_snapshot(SnapshotMeta(0, 0, membership))
            recovered = self.storage.recover()
        self.sm = self.machines.new()
        found = self.snapshots.load_latest(self.machines.restored)  # one read, checked as it goes
        if found is not None:
            latest, self.sm = found
            if latest.meta.index > recovered.snapshot.index:
                # A crash came between making the snapshot durable and moving the log past it.
                self.storage.install_snapshot(latest.meta)
                recovered = self.storage.recover()
            elif latest.meta.index < recovered.snapshot.index:
                raise StorageError(
                    f"{latest.path}: the newest snapshot that verifies is at index "
                    f"{latest.meta.index}, but the log starts after {recovered.snapshot.index}. "
                    "Remove the data dir and re-add this member as a learner"
                )
            self._remember_snapshot(latest)
        elif recovered.snapshot.index > 0:
            raise StorageError(
                f"{cfg.data_dir}: the log starts after index {recovered.snapshot.index} but no "
                "snapshot file covers it. Remove the data dir and re-add this member as a learner"
            )
        self.machines.check_data_dir(self.datadir.path, fsync=cfg.fsync)  # once it is known
        self.applied = self.metrics.applied = recovered.snapshot.index
        self.space.observe(free_bytes(cfg.data_dir))
        settings = Settings(
            rng=random.Random(),  # a member's own timeouts need no reproducibility
            election_ticks=cfg.election_ticks,
            heartbeat_ticks=1,
            wall_clock_ms=wall_clock_ms,
        )
        self.core = RaftCore(cfg.name, settings, recovered)
        # A member that starts empty to be added (`existing`) votes only once the cluster is
        # known to count it as new: if its disk was lost, it may still count it as a voter.
        admission = read_admission(self.datadir.path)
        if admission is None and self.datadir.created and cfg.initial_cluster_state == \
                "existing" and not interrupted:
            self.core.await_admission()
            write_admission(self.datadir.path, self.core.admission, fsync=cfg.fsync)
        elif admission is not None:
            self.core.await_admission(admission)
        self._admission_saved = self.core.admission
        if self.core.admission is not None:
            self._log_admission(self.core.admission, at_start=True)
        self.archiver = None
        if cfg.archive:
            archive = open_archive(cfg.archive, endpoint=cfg.s3_endpoint, region=cfg.s3_region,
                                   settings=NODE_ARCHIVE_SETTINGS, encryption=cfg.s3_encryption)
            self.archiver = Archiver(self, ClusterArchive(archive, cfg.cluster_id,
                                                          keys=cfg.archive_keys))
        self.transport = PeerTransport(
            cfg.name, cfg.cluster_id, cfg.advertise_peer, cfg.advertise_client,
            on_unreachable=self._peer_unreachable, on_snapshot_sent=self._snapshot_sent,
            snapshot_source=self._snapshot_payload,
            snapshot_reference=self._snapshot_reference,
            # A stream that swallows bytes is noticed within 1.5 pings and dialled again.
            ping_interval=max(1.0, cfg.election_timeout_ms / 1000),
            ssl_context=self.tls.peer_client,
        )
        for name, url in cfg.initial_cluster.items():
            self.transport.learn(name, peer_url=url, source=CONFIGURED)
        self.transport.learn(cfg.name, cfg.advertise_peer, cfg.advertise_client,
                             source=CONFIGURED)
        self._learn_addresses(self.core.membership)

    async def start(self) -> None:
        if self.admin_token_file is not None:  # logged once serving: a refusal is one line
            log.info("no --admin-token given: the admin API takes the token in %s",
                     self.admin_token_file)
        await self.transport.start()
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._ticker()),
                       asyncio.create_task(self._watch_disk())]
        if self.archiver is not None:
            self.archiver.start()

    async def stop(self) -> None:
        """Hand leadership over (within 5 s) if we lead, then stop."""
        if self.core.role is Role.LEADER and self.fatal is None:
            await self._hand_over_leadership(deadline=time.monotonic() + 5)
        self._stopping = True
        self._wakeup.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.archiver is not None:
            await self.archiver.stop()
        await self.transport.close()
        self.storage.close()
        self._lock.release()
        waiting = [*self._reads.values(), *(p.future for p in self._proposals.values()),
                   *(fut for _, fut in self._waiters)]
        for fut in waiting:
            if not fut.done():
                fut.set_exception(Unavailable("the member is shutting down"))

    async def _hand_over_leadership(self, deadline: float) -> None:
        voters = [n for n in self.core.membership.voters if n != self.name]
        if not voters:
            return
        best = max(voters, key=lambda n: (self.core.progress.get(n).match
                                          if n in self.core.progress else -1, n))
        try:
            self.transfer_leadership(best)
        except ProposalError as exc:
            log.warning("could not hand leadership to %s: %s", best, exc)
            return
        while time.monotonic() < deadline and self.core.role is Role.LEADER:
            await asyncio.sleep(0.02)

    # --- inputs ---------------------------------------------------------------------------

    def deliver(self, messages: list[Message]) -> None:
        self._inbox.extend(messages)
        self._wakeup.set()

    async def propose(self, command: bytes) -> Any:
        """Commit `command` through the log and return the state machine's result."""
        self.space.check()  # raises alarms.NoSpace while free space is below the quota
        if (len(self._proposals) >= MAX_PENDING_PROPOSALS
                or self._pending_bytes + len(command) > MAX_PENDING_BYTES):
            self.metrics.proposals_refused += 1
            raise Overloaded(
                f"{len(self._proposals)} writes ({self._pending_bytes} bytes) are already "
                "waiting for the disk or the followers; retry shortly")
        if self._stopping:
            raise Unavailable("the member is shutting down")
        index = self.core.propose(command)  # raises NotLeader / TransferInProgress
        fut = asyncio.get_running_loop().create_future()
        self._proposals[index] = _Proposal(self.core.term, fut, len(command))
        self._pending_bytes += len(command)
        self.metrics.proposals += 1
        self._wakeup.set()
        return await fut

    async def change_membership(self, voters, learners, addresses=None, clients=None) -> int:
        index = self.core.change_membership(voters, learners, addresses, clients)
        self._wakeup.set()
        await self.wait_applied(index)
        return index

    async def wait_applied(self, index: int) -> int:
        """Return (the applied index) once everything up to `index` is applied here."""
        if self.applied >= index:
            return self.applied
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((index, fut))
        return await fut

    def transfer_leadership(self, target: str) -> None:
        self.core.transfer_leadership(target)  # raises NotLeader / InvalidMembership
        self._wakeup.set()

    async def read_barrier(self) -> int:
        """Linearizable read (ReadIndex): returns once local state is at least as new as every
        write acknowledged before the call; the answer reflects the returned applied index."""
        if self._stopping:
            raise Unavailable("the member is shutting down")
        read_id = next(self._read_ids)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._reads[read_id] = fut
        self._unanswered_reads[read_id] = loop.time()
        self.core.read_index(read_id)
        self._wakeup.set()
        try:
            return await fut
        finally:
            self._reads.pop(read_id, None)
            self._unanswered_reads.pop(read_id, None)

    def _retry_reads(self, older_than: float) -> None:
        """Ask again for read indexes nobody answered: the request may have gone to a leader
        that died or was cut off (etcd retries likewise), or been lost on the way."""
        if not self._unanswered_reads:
            return
        now = asyncio.get_running_loop().time()
        for read_id, asked in list(self._unanswered_reads.items()):
            if now - asked >= older_than:
                self._unanswered_reads[read_id] = now
                self.core.read_index(read_id)
        self._wakeup.set()

    # --- the loop ------------------------------------------------------------------------

    async def _ticker(self) -> None:
        interval = self.cfg.heartbeat_ms / 1000
        retry_reads_after = max(interval, min(0.5, self.cfg.election_timeout_ms / 2000))
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._stopping:
            next_at += interval
            now = loop.time()
            if now - next_at > interval:
                # We were paused (SIGSTOP, a stalled VM, a long GC): ticks missed are not
                # replayed in a burst, which would time out elections before the messages
                # queued meanwhile are even read. Time resumes from now.
                next_at = now
            await asyncio.sleep(max(0.0, next_at - now))
            self.core.tick()
            self._wakeup.set()
            self._retry_reads(older_than=retry_reads_after)

    async def _run(self) -> None:
        core = self.core
        while not self._stopping:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                while True:
                    if self._inbox:
                        inbox, self._inbox = self._inbox, []
                        for m in inbox:
                            core.step(m)
                    if not core.has_ready():
                        break
                    await self._carry_out(core.ready())
            except Exception as exc:  # any failure here ends the member
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        """Stop the member for good: `main` exits 3 for a storage failure (a full disk
        included: ENOSPC from anywhere becomes a DiskFullError giving the space left), else 1."""
        full = disk_full(exc, self.cfg.data_dir)
        if full is not None:
            log.error("%s; this member stops", full)
            exc = full
        elif isinstance(exc, StorageError):
            log.error("storage failed; this member stops to protect its data", exc_info=exc)
        else:
            log.error("the member's main loop failed; stopping", exc_info=exc)
        if self.fatal is None:
            self.fatal = exc
        self._stopping = True
        self.dead.set()

    async def _watch_disk(self) -> None:
        """About once a second, off the loop: measure free space (the NOSPACE alarm) and record
        the commit index in the hard state if it moved (never an fsync per write)."""
        storage = self.storage
        data_dir = self.cfg.data_dir

        def measure() -> int:
            storage.save_commit()
            return free_bytes(data_dir)

        while not self._stopping:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                self.space.observe(await asyncio.to_thread(measure))
            except Exception as exc:  # a full disk, or a hard-state write that failed
                self._fail(exc)
                return

    async def _carry_out(self, rd: Ready) -> None:
        core = self.core
        if rd.messages:
            self.transport.send(rd.messages)
        storage = self.storage
        storage.note_commit(core.log.committed)  # recorded with a later write (save_commit)
        if rd.snapshot is not None:
            await self._install_snapshot(rd)
        if rd.entries:
            appending = time.perf_counter()
            storage.append(rd.entries)
            self.space.wrote(self._count_log_bytes(rd.entries))
        if rd.hard_state is not None:
            storage.save_hard_state(rd.hard_state)
        if rd.entries:
            syncing = time.perf_counter()
            await asyncio.to_thread(storage.sync)
            done = time.perf_counter()
            self.metrics.observe_append(len(rd.entries), done - appending, done - syncing)
        if rd.persisted_messages:
            self.transport.send(rd.persisted_messages)
        if rd.soft_state is not None:
            self._soft_state_changed(rd)
        if rd.committed_entries:
            self._apply(rd.committed_entries)
            if self.archiver is not None:
                self.archiver.committed(self.applied)
        for rs in rd.read_states:
            fut = self._reads.get(rs.context)
            if fut is not None and not fut.done() and rs.context in self._unanswered_reads:
                del self._unanswered_reads[rs.context]  # a retried read may be answered twice
                self._waiters.append((rs.index, fut))
        for context in rd.failed_reads:
            fut = self._reads.get(context)
            if fut is not None and not fut.done():
                fut.set_exception(Unavailable("no leader could confirm the read; retry"))
        self._release_waiters()
        if core.admission != self._admission_saved:
            await asyncio.to_thread(write_admission, self.datadir.path, core.admission,
                                    fsync=self.cfg.fsync)
            self._log_admission(core.admission)
            self._admission_saved = core.admission
        core.advance(rd)
        self._maybe_snapshot()

    def _log_admission(self, state: tuple[str, int] | None, *, at_start: bool = False) -> None:
        """One line per step of a member that started empty (see RaftCore.await_admission):
        the warning only when the cluster really counts it as a voter it cannot be."""
        if state is None:
            log.info("admitted: the configuration shows this member is new to the cluster; "
                     "it votes from now on (once it is a voter)")
        elif state[0] == FENCED:
            log.warning("this member started with an empty data dir, but the cluster counts "
                        "it as a voter: its disk was lost. It will not vote or campaign until "
                        "it is removed (DELETE /v1/members/%s) and added back as a learner "
                        "(POST /v1/members)", self.name)
        elif at_start:
            log.info("started empty: waiting to be added as a learner (POST /v1/members on "
                     "the leader); it will not vote before the cluster's configuration shows "
                     "it is new")
        else:
            log.info("heard from leader %s: the configuration as of index %d will show "
                     "whether this member is new; it will not vote before", self.core.leader,
                     state[1])

    def _apply(self, entries: tuple[Entry, ...]) -> None:
        sm = self.sm
        proposals = self._proposals
        for entry in entries:
            result: Any = None
            if entry.kind == EntryKind.NORMAL:
                result = sm.apply(entry.index, entry.data)
            elif entry.kind == EntryKind.MEMBERSHIP:
                self._learn_addresses(Membership.decode(entry.data))
                self._publish_client_url(entry.term)
            else:  # a leader's no-op: its term's first entry
                self._publish_client_url(entry.term)
            self.applied = entry.index
            waiting = proposals.pop(entry.index, None) if proposals else None
            if waiting is None:
                continue
            self._pending_bytes -= waiting.size
            if not waiting.future.done():
                if waiting.term == entry.term:
                    waiting.future.set_result(result)
                else:
                    waiting.future.set_exception(
                        Unavailable("leadership changed before the write committed; retry"))
        self.metrics.applied = self.applied

    def _release_waiters(self) -> None:
        if not self._waiters:
            return
        applied = self.applied
        keep = []
        for index, fut in self._waiters:
            if index > applied:
                keep.append((index, fut))
            elif not fut.done():
                fut.set_result(applied)
        self._waiters = keep

    def _soft_state_changed(self, rd: Ready) -> None:
        soft = rd.soft_state
        self.metrics.term = soft.term
        self.metrics.is_leader = soft.role is Role.LEADER
        # Proposals taken while leading stay pending after a step-down: a later leader may
        # still commit them, and they are answered when their index is applied.
        log.info("%s is %s in term %d (leader %s)", self.name, soft.role.label, soft.term,
                 soft.leader)
        if soft.leader is not None:
            self._retry_reads(older_than=0.0)  # reads asked of the old leader go to the new one

    def _learn_addresses(self, membership: Membership) -> None:
        for name, url in membership.addresses:
            self.transport.learn(name, peer_url=url, source=MEMBERSHIP)
        for name, url in membership.clients:
            self.transport.learn(name, client_url=url, source=MEMBERSHIP)
        if membership.clients:
            self._client_urls_learned.set()

    def heard_client_url(self, sender: str, url: str) -> None:
        """A member (named by its certificate, with TLS) says where its clients connect. Only
        the leader takes note, and only to commit it to the configuration: nothing dials a
        client URL before the log gives it, and followers forward only to the URL the leader
        published for itself."""
        core = self.core
        if (core.role is not Role.LEADER or len(url) > 512
                or self._heard_clients.get(sender) == url):
            return
        self._heard_clients[sender] = url
        self._publish_client_url(core.term)

    def _publish_client_url(self, term: int) -> None:
        """A leader whose term's entries apply makes sure the configuration gives its client
        URL (and those its members reported of themselves): that is where followers forward
        clients (a peer's say-so never is)."""
        core = self.core
        if core.role is not Role.LEADER or term != core.term:
            return
        try:
            urls = {**self._heard_clients, self.name: self.cfg.advertise_client}
            if core.publish_client_urls(urls) is not None:
                self._wakeup.set()
        except MembershipChangeInProgress:
            pass  # the change's entry applies later and calls this again
        except ProposalError as exc:  # a transfer under way: the next leader publishes its own
            log.debug("not publishing this member's client URL now: %s", exc)

    def _peer_unreachable(self, peer: str) -> None:
        self.core.report_unreachable(peer)

    # --- snapshots -----------------------------------------------------------------------

    def _count_log_bytes(self, entries: tuple[Entry, ...]) -> int:
        size = sum(len(e.data) + 24 for e in entries)
        self._entries_since_snapshot += len(entries)
        self._log_bytes_since_snapshot += size
        return size

    def _maybe_snapshot(self) -> None:
        if self._snapshotting or self.applied <= self.core.log.snapshot.index:
            return
        rule = self.cfg.snapshot_policy.should_snapshot(
            self._log_bytes_since_snapshot, self._entries_since_snapshot, self._snapshot_bytes)
        if rule is not None:
            self._snapshotting = True
            task = asyncio.create_task(self.take_snapshot(reason=rule, claimed=True))
            self._background.add(task)  # a task nobody references may be collected mid-run
            task.add_done_callback(self._snapshot_done)

    def _snapshot_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None and self.fatal is not exc:
            log.error("the snapshot failed; the log keeps growing until one succeeds",
                      exc_info=exc)

    async def take_snapshot(self, reason: str = "requested", *, claimed: bool = False
                            ) -> dict[str, Any]:
        """Write a snapshot of the applied state without stopping applies, then compact.
        A request that finds another snapshot being written waits for it (for at most
        SNAPSHOT_WAIT s, else RuntimeError) and then returns it, or writes a newer one
        (`claimed`: the caller already set the flag for this one)."""
        if not claimed and not await _wait_until(lambda: not self._snapshotting,
                                                 self._snapshot_idle, SNAPSHOT_WAIT):
            raise RuntimeError("a snapshot is already being written")
        self._snapshotting = True
        try:
            index = self.applied
            core = self.core
            if self._snapshot is not None and self._snapshot.meta.index == index:
                return self._snapshot_doc()
            meta = SnapshotMeta(index, core.log.term(index), core.log.membership_at(index),
                                core.log.ts(index))
            # Applies go on while it is written (a frozen overlay, or a forked child).
            path = await snapshot_into_store(self.snapshots, meta, self.sm)
            # Entries the archive does not have yet stay in the log (the archiver ships them).
            retain = self.archiver.retain_after() if self.archiver is not None else None
            core.compact(index, keep_entries=0 if retain is None else max(0, index - retain))
            await asyncio.to_thread(self.storage.compact, index, retain)
            self._remember_snapshot(StoredSnapshot(meta, self.sm.kind, path))
            self.metrics.snapshots_taken += 1
            log.info("snapshot at %d (%d bytes, %s)", index, self._snapshot_bytes, reason)
            if self.archiver is not None:
                self.archiver.poke()
            return self._snapshot_doc()
        except (OSError, StorageError) as exc:
            full = disk_full(exc, self.cfg.data_dir)
            if full is None:
                raise
            self._fail(full)  # the log's next write would fail the same way: stop, exit 3
            raise full  # noqa: B904 (disk_full chained the OSError)
        finally:
            self._snapshotting = False
            self._snapshot_idle.set()

    def _remember_snapshot(self, stored: StoredSnapshot) -> None:
        """`stored` is now the newest snapshot file; the log counted since the last resets."""
        self._snapshot = stored
        self._snapshot_bytes = stored.path.stat().st_size
        self._log_bytes_since_snapshot = 0
        self._entries_since_snapshot = 0

    def _snapshot_doc(self) -> dict[str, Any]:
        meta, path = self._snapshot.meta, self._snapshot.path
        return {"index": meta.index, "term": meta.term, "bytes": self._snapshot_bytes,
                "location": path.resolve().as_uri()}

    def _snapshot_payload(self, m: Message):
        stored = self._snapshot
        if stored is None or stored.meta.index != m.snapshot.meta.index:
            return None
        return self.snapshots.open_payload(stored.path)  # verifies its checksum as it streams

    def _snapshot_reference(self, m: Message) -> dict[str, str] | None:
        """Where a follower can fetch the snapshot `m` announces from the archive (the headers
        of a reference), or None: stream it. Only the leader's current snapshot, once
        archived, is referenced: the follower then takes the log tail from this leader."""
        archiver = self.archiver
        if archiver is None:
            return None
        record = archiver.archived_snapshot(m.snapshot.meta.index, m.snapshot.meta.term)
        if record is None:
            return None
        return {SNAPSHOT_KEY_HEADER: record.key, SNAPSHOT_SHA_HEADER: record.sha256,
                SNAPSHOT_SIZE_HEADER: str(record.size)}

    async def receive_archived_snapshot(self, m: Message, key: str, sha256: str,
                                        size: int) -> None:
        """The leader says: fetch snapshot `m` from the archive at `key`. Download, verify and
        store it, then step the message. Raises ArchiveError when that cannot be done here
        (no archive configured, unreachable, corrupt): the leader then streams it."""
        if self.archiver is None:
            raise ArchiveError("this member has no --archive configured; stream the snapshot")
        meta = m.snapshot.meta
        record = SnapshotRecord(meta.index, meta.term, key, size, sha256)
        cluster = self.archiver.cluster

        def fetch(path: Path) -> None:
            cluster.download_snapshot(record, path)

        try:
            stored = await asyncio.to_thread(self.snapshots.adopt, meta, fetch)
        except (StorageError, RuntimeError) as exc:
            raise ArchiveError(f"cannot use archived snapshot {key}: {exc}") from exc

        try:  # restored into a fresh machine before anything relies on it
            machine = await asyncio.to_thread(
                _checked_machine, self.machines, lambda: self.snapshots.open_payload(stored.path),
                f"archived snapshot {key}")
        except SnapshotRefused as exc:
            stored.path.unlink(missing_ok=True)
            raise ArchiveError(str(exc)) from None
        self._verified_machine = (stored.path, machine)
        self._snapshot = stored
        self._snapshot_bytes = stored.path.stat().st_size
        self._snapshot_sources[stored.path] = "archive"
        m.snapshot.data = stored.path
        log.info("fetched snapshot %d from %s", meta.index, cluster.location(record))
        self.deliver([m])

    def _snapshot_sent(self, peer: str, ok: bool, via: str = "leader") -> None:
        self.core.report_snapshot(peer, ok)
        if ok and via == "archive":
            self.metrics.snapshot_references_sent += 1
        elif ok:
            self.metrics.snapshots_sent += 1
        self._wakeup.set()

    async def receive_snapshot(self, m: Message, chunks) -> None:
        """A leader streams us a snapshot: store it durably, then step the message."""
        meta = m.snapshot.meta
        writer = self.snapshots.begin(meta, self.sm.kind)
        try:
            async for chunk in chunks:
                await asyncio.to_thread(writer.write, chunk)
            # Restored into a fresh machine before it replaces anything: a snapshot that does
            # not restore is refused, and this member keeps running on what it had.
            machine = await asyncio.to_thread(
                _checked_machine, self.machines, writer.written_payload,
                f"snapshot {meta.index} (term {meta.term})")
            path = await asyncio.to_thread(writer.commit)
        except BaseException:
            writer.abort()
            raise
        self._verified_machine = (path, machine)
        # The store keeps one committed snapshot besides the one in progress, so this file is
        # now the newest one there (the core may still decline it if it has caught up).
        self._snapshot = StoredSnapshot(meta, self.sm.kind, path)
        self._snapshot_bytes = path.stat().st_size
        m.snapshot.data = path
        self.deliver([m])

    async def _install_snapshot(self, rd: Ready) -> None:
        snap = rd.snapshot
        path = snap.data
        if not isinstance(path, Path):
            raise StorageError("a snapshot to install arrived without its file")

        def restore() -> StateMachine:
            with self.snapshots.open_payload(path) as payload:
                return self.machines.restored(payload)

        verified, self._verified_machine = self._verified_machine, None
        if verified is not None and verified[0] == path:
            self.sm = verified[1]  # restored when it arrived
        else:
            self.sm = await asyncio.to_thread(restore)
        await asyncio.to_thread(self.storage.install_snapshot, snap.meta)
        self.applied = self.metrics.applied = snap.meta.index
        self._learn_addresses(snap.meta.membership)
        self._remember_snapshot(StoredSnapshot(snap.meta, self.sm.kind, path))
        source = self._snapshot_sources.pop(path, "leader")
        self.metrics.snapshots_installed[source] += 1
        for index in [i for i in self._proposals if i <= snap.meta.index]:
            p = self._proposals.pop(index)
            self._pending_bytes -= p.size
            if not p.future.done():
                p.future.set_exception(Unavailable("superseded by a snapshot; retry"))
        log.info("installed snapshot %d (from the %s)", snap.meta.index, source)

    # --- status ----------------------------------------------------------------------------

    def role(self) -> str:
        """The role as `/v1/status` names it: a learner is not a follower there."""
        return "learner" if self.name in self.core.membership.learners else self.core.role.label

    def status(self) -> dict[str, Any]:
        core = self.core
        log_ = core.log
        membership = core.membership
        members = {}
        for name in sorted(membership.members()):
            if name in membership.learners:
                member_role = "learner"
            elif name == core.leader:
                member_role = "leader"
            else:
                member_role = "follower"
            pr = core.progress.get(name)
            members[name] = {
                "peer_url": self.transport.peer_urls.get(name),
                "client_url": self.transport.client_urls.get(name),
                "role": member_role,
                "match_index": pr.match if pr is not None else None,
            }
        return {
            "name": self.name,
            "cluster_id": self.cfg.cluster_id,
            # Random per data dir: a member whose volume was replaced, or a removed member back
            # on its old volume, is told apart from the member the cluster knew by this alone.
            "member_uid": self.datadir.identity.member_uid,
            # null, or why this member does not vote yet: "undecided" (it started empty and
            # has not yet read the configuration that shows whether it is new) or "fenced"
            # (the cluster counts it as a voter although it started empty: remove it and add
            # it back as a learner).
            "admission": core.admission[0] if core.admission is not None else None,
            "role": self.role(),
            "term": core.term,
            "leader": core.leader,
            "commit_index": log_.committed,
            "applied_index": self.applied,
            # ["NOSPACE"] while free space on the data dir's file system is below
            # --quota-free-bytes and client writes are refused (507): see alarms.py.
            "alarms": self.space.alarms,
            "first_index": log_.first_index(),
            "last_index": log_.last_index(),
            "snapshot": {
                "index": log_.snapshot.index,
                "term": log_.snapshot.term,
                "bytes": self._snapshot_bytes,
            },
            # `index`: where this configuration is in the log; a change is still in flight
            # while it is above commit_index (consensus/membership.py)
            "config": {**membership.describe(), "index": log_.membership_index()},
            "members": members,
            "archive": (self.archiver.status() if self.archiver is not None else
                        {"url": None, "last_snapshot_index": None,
                         "last_archived_index": None, "error": None}),
        }

    def ready(self) -> bool:
        """Knows a leader and has applied what it knew to be committed."""
        return self.core.leader is not None and self.applied >= self.core.log.committed

    def accepts_peer(self, sender: str) -> bool:
        """Whether a peer request from `sender` is taken: a member of the newest configuration
        in the log, or of this member's configured first voters. A member that started empty
        to be added (it knows no configuration yet) takes any sender of its cluster; with TLS
        that is any holder of a certificate from the cluster's CA."""
        if sender == self.name:
            return False
        membership = self.core.membership
        return (not membership.voters  # no configuration yet: every configuration has a voter
                or sender in membership.voters or sender in membership.learners
                or sender in (membership.outgoing or ()) or sender in self.cfg.initial_cluster)

    async def wait_leader_client_url(self, timeout: float) -> str | None:
        """The leader's client URL, once the configuration gives it (within `timeout`)."""
        await _wait_until(lambda: self.leader_client_url() is not None or self._stopping
                          or self.core.leader is None, self._client_urls_learned, timeout)
        return self.leader_client_url()

    def leader_client_url(self) -> str | None:
        leader = self.core.leader
        return self.transport.client_urls.get(leader) if leader else None

