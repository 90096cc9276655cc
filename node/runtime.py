"""The member's runtime: one asyncio task owns the consensus core and carries out its batches.

Inputs (peer messages, proposals, reads, ticks) only queue and wake the loop; the loop steps
them all into the core, then hands each `Ready` to the `Executor` (executor.py), which carries
it out in the order `Ready` documents: the leader's messages at once, append and fsync (in a
worker thread, one fsync for the whole batch: group commit), the messages that needed the
fsync, committed entries applied and their clients answered, reads answered, advance.
Everything that arrives during an fsync is batched into the next one, so throughput grows with
load instead of queueing behind the disk.

Callers wait on futures the loop resolves, never on clocks: a write's future when its entry
applies, a read's once the applied index reaches its read index, and `until(predicate)` for
anything else (a configuration settled, a leadership transfer done, a client URL learned),
checked after every batch.

The runtime is the only owner of the core. Snapshots (snapshotting.py) and the archiver are
collaborators that read the core's facts through `RaftCore.status()` and the runtime's
methods.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flotilla.node.consensus import (
    FENCED,
    Entry,
    EntryKind,
    Membership,
    MembershipChangeInProgress,
    Message,
    NotLeader,
    ProposalError,
    RaftCore,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SoftState,
)
from flotilla.node.storage import LogStorage, StorageError, free_bytes
from flotilla.node.storage.space import disk_full

from .alarms import CHECK_INTERVAL, SpaceAlarm
from .diskthread import DiskThread
from .executor import Executor, Offload
from .metrics import Metrics
from .transport import MEMBERSHIP, PeerTransport

if TYPE_CHECKING:
    from .archiver import Archiver
    from .snapshotting import Snapshotter

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
# How long a leader waits for an append to carry a new commit index before sending it on its
# own (Settings.lazy_commit): a writer's next command usually comes sooner.
COMMIT_NOTICE_S = 0.002
# A write not applied this long after it was proposed fails with TimeoutError (the HTTP layer
# answers 503: its outcome is unknown). Swept once per tick, not timed one by one: a timer per
# write cost the leader 4% of its CPU at 64 clients.
PROPOSAL_TIMEOUT_S = 10.0


@dataclass(slots=True)
class _Proposal:
    term: int
    future: asyncio.Future
    size: int
    deadline: float  # loop time after which the caller is told the outcome is unknown


class Runtime:
    """The loop that owns `core`, and the futures its callers wait on."""

    def __init__(self, core: RaftCore, storage: LogStorage, transport: PeerTransport,
                 machine: Any, *, advertise_client: str, heartbeat_s: float,
                 election_timeout_s: float, metrics: Metrics, space: SpaceAlarm,
                 data_dir: str, save_admission: Callable[[tuple[str, int] | None], None],
                 offload: Offload = asyncio.to_thread) -> None:
        self.core = core
        self.name = core.name
        self.storage = storage
        self.transport = transport
        self.machine = machine  # its state is the snapshot's the log starts after
        self.applied = core.snapshot_index
        self.metrics = metrics
        self.space = space
        self.advertise_client = advertise_client
        self.heartbeat_s = heartbeat_s
        self.election_timeout_s = election_timeout_s
        self.data_dir = data_dir
        self._save_admission = save_admission
        self._admission_saved = core.admission
        self.offload = offload
        self._disk = DiskThread(f"flotilla-disk-{core.name}")
        self.executor = Executor(core, storage, transport.send, self, offload=self._write)
        # Collaborators, set by the Node once built (each needs the runtime first).
        self.snapshots: Snapshotter | None = None
        self.archiver: Archiver | None = None
        self._inbox: list[Message] = []
        self._heard_clients: dict[str, str] = {}  # leader: client URLs members reported
        self._proposals: dict[int, _Proposal] = {}
        self._pending_bytes = 0
        self._read_ids = itertools.count(1)
        self._reads: dict[int, asyncio.Future] = {}
        # Reads still waiting for a read index, and when it was last asked for.
        self._unanswered_reads: dict[int, float] = {}
        # Futures resolved with the applied index once it reaches theirs (reads, admin waits).
        self._waiters: list[tuple[int, asyncio.Future]] = []
        # Futures resolved once their predicate holds, looked at after every batch.
        self._watches: list[tuple[Callable[[], bool], asyncio.Future]] = []
        # Sends the transport could not deliver, per peer (a count that only grows).
        self._unreachable: dict[str, int] = {}
        self._wakeup = asyncio.Event()
        self._commit_notice: asyncio.TimerHandle | None = None
        self._leader_seen: str | None = None  # the leader the last soft state named
        self._batch_entries = 0  # in the batch being carried out
        self.stopping = False
        # Set when the loop that owns the core died: the member must stop, not linger.
        self.fatal: BaseException | None = None
        self.dead = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        metrics.applied = self.applied

    # --- life ------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._ticker()),
                       asyncio.create_task(self._watch_disk())]

    async def stop(self) -> None:
        """Hand leadership over (within 5 s) if this member leads, then stop the loop and
        answer everyone still waiting."""
        if self.core.role is Role.LEADER and self.fatal is None:
            await self._hand_over_leadership(timeout=5.0)
        self.stopping = True
        self._wakeup.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.storage.note_commit(self.core.commit_index)  # closing the log records it
        self._disk.stop()
        self._stop_waiting(Unavailable("the member is shutting down"))

    @property
    def pending_proposals(self) -> int:
        """Writes this member took as leader that are not applied yet."""
        return len(self._proposals)

    def _stop_waiting(self, exc: Exception) -> None:
        self.metrics.proposals_failed += sum(1 for p in self._proposals.values()
                                             if not p.future.done())
        waiting = [*self._reads.values(), *(p.future for p in self._proposals.values()),
                   *(fut for _, fut in self._waiters), *(fut for _, fut in self._watches)]
        for fut in waiting:
            if not fut.done():
                fut.set_exception(exc)

    async def _hand_over_leadership(self, timeout: float) -> None:
        """Hand leadership to the most caught-up voter, within `timeout` seconds. A target the
        transport can no longer reach (it is stopping too, as when a whole cluster is shut
        down) is given up at once for the next voter, and when none is left the member stops
        without waiting out the timeout: the voters still running elect a leader by
        themselves."""
        core = self.core
        deadline = asyncio.get_running_loop().time() + timeout
        settled = self.until(lambda: core.role is not Role.LEADER and core.leader is not None)
        tried: list[str] = []
        try:
            while not settled.done():
                if core.role is not Role.LEADER:  # it voted for a target that then went away
                    log.info("stepped down as leader; %s stopped answering", tried[-1])
                    return
                status = core.status()
                voters = [n for n in status.membership.voters
                          if n != self.name and n not in tried]
                if not voters:
                    if tried:
                        log.info("leadership not handed over: %s stopped answering",
                                 ", ".join(tried))
                    return
                progress = status.progress
                best = max(voters, key=lambda n: (progress[n].match if n in progress else -1, n))
                tried.append(best)
                try:
                    led = self.transfer_leadership(best)  # `settled` covers it (and any leader)
                except ProposalError as exc:
                    log.warning("could not hand leadership to %s: %s", best, exc)
                    return
                lost = self._unreachable_from_now(best)
                try:
                    async with asyncio.timeout_at(deadline):
                        await asyncio.wait((settled, lost), return_when=asyncio.FIRST_COMPLETED)
                except TimeoutError:
                    log.info("leadership not handed over to %s within %g s", best, timeout)
                    return
                finally:
                    led.cancel()
                    lost.cancel()
            log.info("leadership handed over to %s", core.leader)
        finally:
            settled.cancel()

    # --- inputs ----------------------------------------------------------------------------

    def deliver(self, messages: Sequence[Message]) -> None:
        self._inbox.extend(messages)
        self._wakeup.set()

    async def propose(self, command: bytes) -> tuple[int, Any]:
        """Commit `command` through the log: its index and the state machine's result.
        TimeoutError when it is not applied within PROPOSAL_TIMEOUT_S (it may still be,
        later)."""
        index, fut = self.submit(command)
        return index, await fut

    def submit(self, command: bytes) -> tuple[int, asyncio.Future]:
        """`propose` without the wait: append `command` and return its index and the future
        the loop resolves with the machine's result (or TimeoutError, Unavailable). Raises at
        once why it cannot be appended (NotLeader, Overloaded, NoSpace...)."""
        try:
            index = self._take(command)
        except NotLeader:
            raise  # not a failure: the HTTP layer forwards the write to the leader
        except Exception:
            self.metrics.proposals_failed += 1
            raise
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._proposals[index] = _Proposal(self.core.term, fut, len(command),
                                           loop.time() + PROPOSAL_TIMEOUT_S)
        self._pending_bytes += len(command)
        self.metrics.proposals += 1
        self._wakeup.set()
        return index, fut

    def _take(self, command: bytes) -> int:
        """Append `command` to the leader's log, or raise why not."""
        self.space.check()  # raises alarms.NoSpace while free space is below the quota
        if (len(self._proposals) >= MAX_PENDING_PROPOSALS
                or self._pending_bytes + len(command) > MAX_PENDING_BYTES):
            self.metrics.proposals_refused += 1
            raise Overloaded(
                f"{len(self._proposals)} writes ({self._pending_bytes} bytes) are already "
                "waiting for the disk or the followers; retry shortly")
        if self.stopping:
            raise Unavailable("the member is shutting down")
        return self.core.propose(command)  # raises NotLeader / TransferInProgress

    async def change_membership(self, voters, learners, addresses=None, clients=None) -> int:
        """Propose a configuration and return its index once it is applied here."""
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

    def until(self, predicate: Callable[[], bool]) -> asyncio.Future:
        """A future resolved (with None) as soon as `predicate()` holds; it is looked at now
        and after every batch the loop carries out. Callers bound the wait themselves."""
        fut = asyncio.get_running_loop().create_future()
        if predicate():
            fut.set_result(None)
        elif self.stopping:
            fut.set_exception(Unavailable("the member is shutting down"))
        else:
            self._watches.append((predicate, fut))
        return fut

    def _unreachable_from_now(self, peer: str) -> asyncio.Future:
        """A future resolved once the transport fails to deliver a message to `peer` from now
        on (it reports each failure: a closed stream, a refused dial)."""
        failures = self._unreachable.get(peer, 0)
        return self.until(lambda: self._unreachable.get(peer, 0) > failures)

    def transfer_leadership(self, target: str) -> asyncio.Future:
        """Ask the core to hand leadership to `target`; the future is resolved once this member
        knows `target` leads (raises NotLeader / InvalidMembership at once)."""
        self.core.transfer_leadership(target)
        self._wakeup.set()
        core = self.core
        return self.until(lambda: core.leader == target and core.role is not Role.LEADER)

    async def read_barrier(self) -> int:
        """Linearizable read (ReadIndex): returns once local state is at least as new as every
        write acknowledged before the call; the answer reflects the returned applied index."""
        if self.stopping:
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

    def peer_unreachable(self, peer: str) -> None:
        self.core.report_unreachable(peer)
        self._unreachable[peer] = self._unreachable.get(peer, 0) + 1

    def snapshot_reported(self, peer: str, ok: bool) -> None:
        self.core.report_snapshot(peer, ok)
        self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    # --- the loop ------------------------------------------------------------------------

    async def _ticker(self) -> None:
        interval = self.heartbeat_s
        retry_reads_after = max(interval, min(0.5, self.election_timeout_s / 2))
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self.stopping:
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
            self._expire_proposals(loop.time())

    def _expire_proposals(self, now: float) -> None:
        """Fail the writes proposed over PROPOSAL_TIMEOUT_S ago that are still waiting. Their
        entries stay in the log (and in `_proposals`, until applied) and may yet commit: the
        caller learns the outcome is unknown. Proposals are in index order, hence deadline
        order: the sweep stops at the first one still in time."""
        for p in self._proposals.values():
            if p.deadline > now:
                return
            if not p.future.done():
                p.future.set_exception(TimeoutError(
                    f"the write was not committed within {PROPOSAL_TIMEOUT_S:g} s"))

    async def _run(self) -> None:
        core = self.core
        carry_out = self.executor.carry_out
        while not self.stopping:
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
                    rd = core.ready()
                    self._batch_entries = len(rd.entries)
                    await carry_out(rd)
                    self._after_batch()
                if core.commit_news and self._commit_notice is None:
                    self._commit_notice = asyncio.get_running_loop().call_later(
                        COMMIT_NOTICE_S, self._announce_commit)
            except Exception as exc:  # any failure here ends the member
                self.fail(exc)
                return

    def _announce_commit(self) -> None:
        """Followers not sent the leader's commit index by an append since it moved hear it now
        (Settings.lazy_commit)."""
        self._commit_notice = None
        if self.core.commit_news:
            self.core.announce_commit()
            self._wakeup.set()

    def _after_batch(self) -> None:
        if self._watches:
            keep = []
            for predicate, fut in self._watches:
                if fut.done():
                    continue
                if predicate():
                    fut.set_result(None)
                else:
                    keep.append((predicate, fut))
            self._watches = keep
        if self.snapshots is not None:
            self.snapshots.maybe_snapshot(self.applied)

    def fail(self, exc: BaseException) -> None:
        """Stop the member for good: `main` exits 3 for a storage failure (a full disk
        included: ENOSPC from anywhere becomes a DiskFullError giving the space left), else 1."""
        full = disk_full(exc, self.data_dir)
        if full is not None:
            log.error("%s; this member stops", full)
            exc = full
        elif isinstance(exc, StorageError):
            log.error("storage failed; this member stops to protect its data", exc_info=exc)
        else:
            log.error("the member's main loop failed; stopping", exc_info=exc)
        if self.fatal is None:
            self.fatal = exc
        self.stopping = True
        self.dead.set()

    async def _watch_disk(self) -> None:
        """About once a second, off the loop: measure free space (the NOSPACE alarm) and record
        the commit index in the hard state if it moved (never an fsync per write)."""
        storage = self.storage
        data_dir = self.data_dir

        def measure() -> int:
            storage.save_commit()
            return free_bytes(data_dir)

        while not self.stopping:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                self.space.observe(await self.offload(measure))
            except Exception as exc:  # a full disk, or a hard-state write that failed
                self.fail(exc)
                return

    async def _write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The executor's `offload`. A durable write (an fsync) goes to the disk thread, so the
        loop goes on taking requests and peer messages while the disk works, and what arrives
        meanwhile is carried out with the next fsync (group commit). But when nothing at all is
        waiting (a follower's batch of at most one entry, no read pending) the loop
        would only sit idle for the disk: then the write happens in place, which saves the two
        thread wake-ups (there and back) that cost more CPU than the fsync itself. Never on a
        leader: the appends it just handed to the transport go out only while the loop runs,
        and the followers' fsyncs must overlap its own."""
        if (self._batch_entries <= 1 and self.core.role is not Role.LEADER and not self._reads
                and not self._inbox and fn in (self.storage.sync, self.storage.save_hard_state)):
            return fn(*args)
        return await self._disk.run(fn, *args)

    # --- BatchHooks: the executor's calls back -------------------------------------------

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        assert self.snapshots is not None, "a snapshot arrived before the member was built"
        self.machine = await self.snapshots.installed(snapshot)
        meta = snapshot.meta
        self.applied = self.metrics.applied = meta.index
        self.learn_addresses(meta.membership)
        for index in [i for i in self._proposals if i <= meta.index]:
            p = self._proposals.pop(index)
            self._pending_bytes -= p.size
            if not p.future.done():
                self.metrics.proposals_failed += 1
                p.future.set_exception(Unavailable("superseded by a snapshot; retry"))

    def persisted(self, entries: tuple[Entry, ...], append_s: float, sync_s: float) -> None:
        self.metrics.observe_append(len(entries), append_s, sync_s)
        size = self.snapshots.counted(entries) if self.snapshots is not None else 0
        self.space.wrote(size)

    def soft_state_changed(self, soft: SoftState) -> None:
        metrics = self.metrics
        metrics.term = soft.term
        metrics.is_leader = soft.role is Role.LEADER
        if soft.leader is not None and soft.leader != self._leader_seen:
            metrics.leader_changes += 1  # as etcd counts: a leader other than the last named
        self._leader_seen = soft.leader
        # Proposals taken while leading stay pending after a step-down: a later leader may
        # still commit them, and they are answered when their index is applied.
        log.info("%s is %s in term %d (leader %s)", self.name, soft.role.label, soft.term,
                 soft.leader)
        if soft.leader is not None:
            self._retry_reads(older_than=0.0)  # reads asked of the old leader go to the new one

    def apply(self, entries: tuple[Entry, ...]) -> None:
        started = time.perf_counter()
        sm = self.machine
        proposals = self._proposals
        for entry in entries:
            result: Any = None
            if entry.kind == EntryKind.NORMAL:
                result = sm.apply(entry.index, entry.data)
            elif entry.kind == EntryKind.MEMBERSHIP:
                self.learn_addresses(Membership.decode(entry.data))
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
                    self.metrics.proposals_failed += 1
                    waiting.future.set_exception(
                        Unavailable("leadership changed before the write committed; retry"))
        metrics = self.metrics
        metrics.applied = self.applied
        metrics.apply.observe(time.perf_counter() - started)
        if self.archiver is not None:
            self.archiver.committed(self.applied)

    def reads(self, states: tuple[ReadState, ...], failed: tuple[Any, ...]) -> None:
        for rs in states:
            fut = self._reads.get(rs.context)
            if fut is not None and not fut.done() and rs.context in self._unanswered_reads:
                del self._unanswered_reads[rs.context]  # a retried read may be answered twice
                self._waiters.append((rs.index, fut))
        for context in failed:
            fut = self._reads.get(context)
            if fut is not None and not fut.done():
                fut.set_exception(Unavailable("no leader could confirm the read; retry"))

    async def before_advance(self, rd: Ready) -> None:
        self._release_waiters()
        admission = self.core.admission
        if admission != self._admission_saved:
            await self.offload(self._save_admission, admission)
            self.log_admission(admission)
            self._admission_saved = admission

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

    def log_admission(self, state: tuple[str, int] | None, *, at_start: bool = False) -> None:
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

    # --- addresses -------------------------------------------------------------------------

    def learn_addresses(self, membership: Membership) -> None:
        for name, url in membership.addresses:
            self.transport.learn(name, peer_url=url, source=MEMBERSHIP)
        for name, url in membership.clients:
            self.transport.learn(name, client_url=url, source=MEMBERSHIP)

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
            urls = {**self._heard_clients, self.name: self.advertise_client}
            if core.publish_client_urls(urls) is not None:
                self._wakeup.set()
        except MembershipChangeInProgress:
            pass  # the change's entry applies later and calls this again
        except ProposalError as exc:  # a transfer under way: the next leader publishes its own
            log.debug("not publishing this member's client URL now: %s", exc)

    def leader_client_url(self) -> str | None:
        leader = self.core.leader
        return self.transport.client_urls.get(leader) if leader else None

    async def wait_leader_client_url(self, timeout: float) -> str | None:
        """The leader's client URL, once the configuration gives it (within `timeout`)."""
        core = self.core
        try:
            async with asyncio.timeout(timeout):
                await self.until(lambda: self.leader_client_url() is not None
                                 or core.leader is None)
        except (TimeoutError, Unavailable):
            pass
        return self.leader_client_url()

