"""`Node`: one cluster member, whole. The one object the HTTP layer, the peer port and `main`
talk to.

It builds the member from its flags (bootstrap.py opens the data dir; the transport, the
archiver, the runtime and the snapshotter are wired here) and offers its operations: writes,
reads, membership changes, leadership transfer, snapshots, status. Operations that wait return
when the loop resolves their future: a write when its entry applies, a change of voters when
the new configuration is committed and settled, a transfer when the target leads.
Nothing outside this module and the runtime touches the consensus core.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.consensus import Message, Role
from flotilla.node.consensus.membership import caught_up
from flotilla.node.storage import free_bytes, write_admission

from . import bootstrap, tls
from .alarms import SpaceAlarm
from .archiver import NODE_ARCHIVE_SETTINGS, Archiver
from .config import NodeConfig
from .metrics import ArchiveFacts, Metrics, Scrape, member_registry, render
from .runtime import Overloaded, Runtime, Unavailable
from .snapshotting import SnapshotRefused, Snapshotter
from .status import NO_ARCHIVE, ConfigView, MemberStatus, MemberView
from .tls import NodeContexts
from .transport import ADVERTISED, CONFIGURED, MEMBERSHIP, PeerTransport

log = logging.getLogger(__name__)

__all__ = ["Node", "Overloaded", "Refused", "SnapshotRefused", "Unavailable"]


class Refused(Exception):
    """An admin request this member turns down as asked: `code` names why (the HTTP layer
    maps it to a status), the message says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Node:
    def __init__(self, cfg: NodeConfig, contexts: NodeContexts | None = None) -> None:
        self.cfg = cfg
        self.tls = contexts if contexts is not None else NodeContexts()
        self.name = cfg.name
        self.metrics = Metrics()
        self.metrics.certificate_expiry = certificate_expiry(cfg)
        self.registry = member_registry(self.metrics, self.scrape)
        self.space = SpaceAlarm(cfg.data_dir, cfg.quota_free_bytes, self.metrics)
        # Set by `open` when no --admin-token was given: the file holding the generated one.
        self.admin_token_file: Path | None = None
        self.archiver: Archiver | None = None

    # --- life ------------------------------------------------------------------------------

    def open(self) -> None:
        """Open the data dir and build the member (bootstrap.open_member says what it refuses,
        and how)."""
        opened = bootstrap.open_member(self.cfg)
        self._lock = opened.lock
        self.cfg = cfg = opened.cfg
        self.admin_token_file = opened.admin_token_file
        self.datadir = opened.datadir
        self.space.observe(free_bytes(cfg.data_dir))
        self.transport = PeerTransport(
            cfg.name, cfg.cluster_id, cfg.advertise_peer, cfg.advertise_client,
            on_unreachable=self._peer_unreachable, on_snapshot_sent=self._snapshot_sent,
            snapshot_source=self._snapshot_payload,
            snapshot_reference=self._snapshot_reference,
            # A stream that swallows bytes is noticed within 1.5 pings and dialled again.
            ping_interval=max(1.0, cfg.election_timeout_ms / 1000),
            ssl_context=self.tls.peer_client,
        )
        datadir = opened.datadir.path
        self.runtime = runtime = Runtime(
            opened.core, opened.storage, self.transport, opened.machine,
            advertise_client=cfg.advertise_client, heartbeat_s=cfg.heartbeat_ms / 1000,
            election_timeout_s=cfg.election_timeout_ms / 1000, metrics=self.metrics,
            space=self.space, data_dir=cfg.data_dir,
            save_admission=lambda state: write_admission(datadir, state, fsync=cfg.fsync))
        self.machines = opened.machines
        self.snapshots = runtime.snapshots = Snapshotter(
            runtime, opened.store, opened.machines, cfg.snapshot_policy, opened.latest)
        if runtime.core.admission is not None:
            runtime.log_admission(runtime.core.admission, at_start=True)
        if cfg.archive:
            archive = open_archive(cfg.archive, endpoint=cfg.s3_endpoint, region=cfg.s3_region,
                                   settings=NODE_ARCHIVE_SETTINGS, encryption=cfg.s3_encryption)
            self.archiver = runtime.archiver = Archiver(
                self, ClusterArchive(archive, cfg.cluster_id, keys=cfg.archive_keys), cfg)
        for name, url in cfg.initial_cluster.items():
            self.transport.learn(name, peer_url=url, source=CONFIGURED)
        self.transport.learn(cfg.name, cfg.advertise_peer, cfg.advertise_client,
                             source=CONFIGURED)
        runtime.learn_addresses(runtime.core.membership)

    async def start(self) -> None:
        if self.admin_token_file is not None:  # logged once serving: a refusal is one line
            log.info("no --admin-token given: the admin API takes the token in %s",
                     self.admin_token_file)
        await self.transport.start()
        self.runtime.start()
        if self.archiver is not None:
            self.archiver.start()

    async def stop(self) -> None:
        """Hand leadership over (within 5 s) if this member leads, then stop."""
        await self.runtime.stop()
        if self.archiver is not None:
            await self.archiver.stop()
        await self.transport.close()
        self.runtime.storage.close()
        self._lock.release()

    @property
    def fatal(self) -> BaseException | None:
        """Why the member's loop died (it then stops), or None."""
        return self.runtime.fatal

    @property
    def dead(self) -> asyncio.Event:
        return self.runtime.dead

    # --- clients ---------------------------------------------------------------------------

    async def propose(self, command: bytes) -> tuple[int, Any]:
        """Commit `command`: its log index and the machine's result (NotLeader on a
        follower)."""
        return await self.runtime.propose(command)

    def submit(self, command: bytes) -> tuple[int, asyncio.Future]:
        """`propose` without the wait: the index and the future of its result."""
        return self.runtime.submit(command)

    async def read_barrier(self) -> int:
        return await self.runtime.read_barrier()

    @property
    def applied(self) -> int:
        return self.runtime.applied

    @property
    def machine(self) -> Any:
        """The state machine, as of `applied`: read it, never change it."""
        return self.runtime.machine

    def is_leader(self) -> bool:
        return self.runtime.core.role is Role.LEADER

    def leader(self) -> str | None:
        return self.runtime.core.leader

    def leader_client_url(self) -> str | None:
        return self.runtime.leader_client_url()

    async def wait_leader_client_url(self, timeout: float) -> str | None:
        return await self.runtime.wait_leader_client_url(timeout)

    def ready(self) -> bool:
        """Knows a leader and has applied what it knew to be committed."""
        core = self.runtime.core
        return core.leader is not None and self.runtime.applied >= core.commit_index

    # --- membership (the leader's admin operations) -----------------------------------------

    async def add_learner(self, name: str, peer_url: str, client_url: str | None
                          ) -> tuple[int, dict[str, Any]]:
        """Add `name` as a learner; returns the configuration's index once applied here, and
        the configuration document."""
        core = self.runtime.core
        m = core.membership
        if name in m.members():
            raise Refused("member_exists", f"{name} is already a member")
        for other, url in m.addresses:
            if url.rstrip("/") == peer_url.rstrip("/"):
                raise Refused("peer_url_exists", f"{other} already uses {peer_url}")
        core.settled_membership()  # MembershipChangeInProgress before learning any address
        self.transport.learn(name, peer_url, client_url, source=MEMBERSHIP)
        index = await self.runtime.change_membership(
            m.voters, m.learners | {name}, {name: peer_url},
            {name: client_url} if client_url else None)
        return index, core.membership.describe()

    async def set_voters(self, voters: frozenset[str]) -> dict[str, Any]:
        """Make `voters` the voters (learners promoted once caught up, voters left out become
        nothing); returns the configuration once the change has settled. Idempotent."""
        core = self.runtime.core
        m = core.membership
        core.settled_membership()  # 409 comes before any 422
        if voters == m.voters:
            return m.describe()
        for name in sorted(voters - m.voters):
            if name not in m.learners:
                raise Refused("not_a_learner", f"{name} is not a learner of this cluster: add "
                              "it first (POST /v1/members) and let it catch up")
            match, committed = core.match_index(name), core.commit_index
            if not caught_up(match, committed):
                raise Refused("not_caught_up", f"learner {name} has not caught up yet (match "
                              f"{match or 0}, commit {committed}); retry when it has")
        await self.runtime.change_membership(voters, m.learners - voters)
        await self._settled(voters)
        return core.membership.describe()

    async def remove_member(self, name: str) -> dict[str, Any]:
        core = self.runtime.core
        m = core.membership
        if name not in m.members():
            raise Refused("not_found", f"{name} is not a member")
        if name in m.learners:
            await self.runtime.change_membership(m.voters, m.learners - {name})
        else:
            if m.voters == {name}:
                raise Refused("invalid_config", "cannot remove the last voter")
            await self.runtime.change_membership(m.voters - {name}, m.learners)
            await self._settled(m.voters - {name})
        return core.membership.describe()

    async def _settled(self, voters: frozenset[str]) -> None:
        """Return once a configuration that is not joint is committed (C_new, when the change
        went through). A leader that removed itself commits C_new and then steps down, so
        losing leadership is not failure; a C_new with other voters means the change was lost
        with a leadership change (Unavailable: retry)."""
        core = self.runtime.core
        await self.runtime.until(core.membership_settled)
        m = core.membership
        if m.voters != voters:
            raise Unavailable(f"the change to {sorted(voters)} was lost when leadership "
                              f"changed (voters are {sorted(m.voters)}); retry")

    async def transfer_leadership(self, target: str, timeout: float) -> tuple[str, int]:
        """Hand leadership to `target`; returns (leader, term) once it leads."""
        core = self.runtime.core
        if target not in core.membership.members():
            raise Refused("not_found", f"{target[:80]!r} is not a member of this cluster")
        if target != self.name:
            try:
                async with asyncio.timeout(timeout):
                    await self.runtime.transfer_leadership(target)
            except TimeoutError:
                raise Unavailable(f"{target} did not take over in time; check /v1/status"
                                  ) from None
        return target, core.term

    # --- snapshots -------------------------------------------------------------------------

    async def take_snapshot(self) -> dict[str, Any]:
        return await self.snapshots.take()

    def _snapshot_payload(self, m: Message):
        return self.snapshots.payload(m)

    def _snapshot_reference(self, m: Message) -> dict[str, str] | None:
        return self.snapshots.reference(m)

    def _snapshot_sent(self, peer: str, ok: bool, via: str = "leader") -> None:
        self.snapshots.sent(peer, ok, via)

    async def receive_snapshot(self, m: Message, chunks) -> None:
        await self.snapshots.receive_streamed(m, chunks)

    async def receive_archived_snapshot(self, m: Message, key: str, sha256: str,
                                        size: int) -> None:
        await self.snapshots.receive_archived(m, key, sha256, size)

    # --- the peer port -----------------------------------------------------------------------

    def deliver(self, messages: list[Message]) -> None:
        self.runtime.deliver(messages)

    def _peer_unreachable(self, peer: str) -> None:
        self.runtime.peer_unreachable(peer)

    def accepts_peer(self, sender: str) -> bool:
        """Whether a peer request from `sender` is taken: a member of the newest configuration
        in the log, or of this member's configured first voters. A member that started empty
        to be added (it knows no configuration yet) takes any sender of its cluster; with TLS
        that is any holder of a certificate from the cluster's CA."""
        if sender == self.name:
            return False
        membership = self.runtime.core.membership
        return (not membership.voters  # no configuration yet: every configuration has a voter
                or sender in membership.voters or sender in membership.learners
                or sender in (membership.outgoing or ()) or sender in self.cfg.initial_cluster)

    def knows_configuration(self) -> bool:
        """False for a member that started empty to be added, until it hears one."""
        return bool(self.runtime.core.membership.voters)  # every configuration has a voter

    def heard_peer_url(self, sender: str, url: str) -> None:
        """A member that knows no configuration yet (it started empty, to be added) learns how
        to answer whoever adds it from that peer's batch; every other member dials only the
        URLs of its flags and of the committed configuration."""
        if not self.knows_configuration():
            self.transport.learn(sender, url, source=ADVERTISED)

    def heard_client_url(self, sender: str, url: str) -> None:
        self.runtime.heard_client_url(sender, url)

    # --- status ----------------------------------------------------------------------------

    def role(self) -> str:
        """The role as `/v1/status` names it: a learner is not a follower there."""
        core = self.runtime.core
        return "learner" if self.name in core.membership.learners else core.role.label

    def status(self) -> MemberStatus:
        core = self.runtime.core.status()
        membership = core.membership
        transport = self.transport
        members = {}
        for name in sorted(membership.members()):
            if name in membership.learners:
                member_role = "learner"
            elif name == core.leader:
                member_role = "leader"
            else:
                member_role = "follower"
            pr = core.progress.get(name)
            members[name] = MemberView(transport.peer_urls.get(name),
                                       transport.client_urls.get(name), member_role,
                                       pr.match if pr is not None else None)
        archive = self.archiver.status() if self.archiver is not None else NO_ARCHIVE
        return MemberStatus(
            name=self.name,
            cluster_id=self.cfg.cluster_id,
            member_uid=self.datadir.identity.member_uid,
            admission=core.admission[0] if core.admission is not None else None,
            role=self.role(),
            term=core.term,
            leader=core.leader,
            commit_index=core.commit_index,
            applied_index=self.runtime.applied,
            alarms=tuple(self.space.alarms),
            first_index=core.first_index,
            last_index=core.last_index,
            snapshot_index=core.snapshot.index,
            snapshot_term=core.snapshot.term,
            snapshot_bytes=self.snapshots.bytes,
            config=ConfigView(tuple(sorted(membership.voters)),
                              tuple(sorted(membership.learners)),
                              None if membership.outgoing is None
                              else tuple(sorted(membership.outgoing)),
                              core.membership_index),
            members=members,
            archive=archive,
        )

    # --- what the archiver reads ------------------------------------------------------------

    def term(self) -> int:
        return self.runtime.core.term

    def commit_index(self) -> int:
        return self.runtime.core.commit_index

    def log_span(self) -> tuple[int, int]:
        status = self.runtime.core.status()
        return status.first_index, status.last_index

    def term_at(self, index: int) -> int | None:
        return self.runtime.core.term_at(index)

    def stored_first_index(self) -> int:
        """The first index the log on disk still holds."""
        return self.runtime.storage.first_index()

    def stored_entries(self, lo: int, hi: int):
        return self.runtime.storage.entries(lo, hi)

    def latest_snapshot(self):
        """The newest snapshot file (verified when it was written or received), or None."""
        return self.snapshots.latest

    def render_metrics(self) -> bytes:
        """`GET /metrics`: the Prometheus text of this member's registry (metrics.py)."""
        return render(self.registry)

    def scrape(self) -> Scrape:
        """The facts `/metrics` reports besides what the member counts as it works."""
        runtime = self.runtime
        core = runtime.core
        status = core.status()
        membership = status.membership
        transport = self.transport
        learner_lag = {name: max(0, status.last_index - status.progress[name].match)
                       for name in membership.learners if name in status.progress}
        archive = None
        if self.archiver is not None:
            archiver = self.archiver
            archive = ArchiveFacts(
                archiver.last_archived_index, archiver.last_snapshot_index,
                dict(archiver.uploads), archiver.failures,
                max(0, status.commit_index - archiver.last_archived_index)
                if self.is_leader() else None)
        return Scrape(
            role=self.role(), commit_index=status.commit_index,
            has_leader=core.knows_leader(), voters=len(membership.voters),
            learners=len(membership.learners), pending_proposals=runtime.pending_proposals,
            snapshot_bytes_sent=transport.snapshot_bytes_streamed,
            acks_beyond_sent=status.acks_beyond_sent,
            sender_restarts=transport.sender_failures, peer_dials=dict(transport.dials),
            peer_rtt=dict(transport.round_trips), learner_lag=learner_lag, archive=archive)


def certificate_expiry(cfg: NodeConfig) -> dict[str, float]:
    """notAfter (seconds since the epoch) of the certificate each TLS port serves; the
    member reads its certificates once, at start, so these are the ones in use."""
    expiry = {}
    for usage, path in (("client", cfg.cert_file), ("peer", cfg.peer_cert_file)):
        if path:
            try:
                expiry[usage] = tls.expires(Path(path).read_bytes()).timestamp()
            except (OSError, ValueError) as exc:
                log.warning("cannot read the expiry of %s (%s); it is not exported", path, exc)
    return expiry
