"""A member's own `GET /v1/status`, parsed once where it enters the operator.

The planner, the reconciler and `flotilla scale` read these frozen types instead of the JSON:
what a field means, and what it is when a member does not send it, is decided here and
nowhere else. Parsing is tolerant the way the members are old: a field that is absent or null
takes its default (a member from before `config.index` gives 0, which `change_in_flight` reads
as "only the joint flag tells"). A document that is not a status at all (not an object, no
name, a term that is not a number) gives None, and the reason is logged: to the planner such
a member does not answer, which is what it would have to assume anyway.

Pure: no I/O. `members.Members.status` fetches and parses; `flotilla scale` parses what
`LocalCluster.member_status` fetched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ArchiveState", "Configuration", "Joint", "MemberStatus", "Progress",
           "SnapshotState"]

log = logging.getLogger("flotilla.operator")


class NotAStatus(ValueError):
    """The document is not a member's status; the message says why."""


@dataclass(frozen=True, slots=True)
class Joint:
    """The two voter sets of a joint configuration (C_old,new): both must agree."""

    old: frozenset[str]
    new: frozenset[str]


@dataclass(frozen=True, slots=True)
class Configuration:
    """The newest configuration the member holds (committed or not)."""

    voters: frozenset[str] = frozenset()
    learners: frozenset[str] = frozenset()
    joint: Joint | None = None
    # Where this configuration sits in the log (0 from members older than the field): a change
    # is still in flight while it is above the commit index.
    index: int = 0

    @property
    def members(self) -> frozenset[str]:
        return self.voters | self.learners


@dataclass(frozen=True, slots=True)
class Progress:
    """One member of the configuration as the member reporting sees it (only a leader knows
    `match_index`: how far that member's log is known to match its own)."""

    role: str = "unknown"  # leader, follower or learner
    match_index: int | None = None
    peer_url: str | None = None
    client_url: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotState:
    index: int = 0
    term: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class ArchiveState:
    """What the member has shipped to its archive (nothing known: all None)."""

    url: str | None = None
    last_snapshot_index: int | None = None
    last_archived_index: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class MemberStatus:
    name: str
    role: str  # leader, follower, candidate or learner
    term: int = 0
    leader: str | None = None
    commit_index: int = 0
    applied_index: int = 0
    first_index: int = 0
    last_index: int = 0
    cluster_id: str | None = None
    # Random per data dir: a member whose volume was replaced, or a removed member back on its
    # old volume, is told apart from the member the cluster knew by this alone.
    member_uid: str | None = None
    # None, or why the member does not vote yet ("undecided", "fenced").
    admission: str | None = None
    alarms: tuple[str, ...] = ()
    snapshot: SnapshotState = field(default_factory=SnapshotState)
    config: Configuration = field(default_factory=Configuration)
    # Every member of the configuration, by name (match indexes only from a leader).
    members: Mapping[str, Progress] = field(default_factory=dict)
    archive: ArchiveState = field(default_factory=ArchiveState)

    @property
    def leads(self) -> bool:
        return self.role == "leader"

    def match(self, name: str) -> int | None:
        """How far `name`'s log is known to match this member's (None: not known)."""
        progress = self.members.get(name)
        return progress.match_index if progress is not None else None

    @classmethod
    def parse(cls, doc: Any, source: str = "a member") -> MemberStatus | None:
        """The status in `doc` (the JSON of `GET /v1/status`), or None, with the reason
        logged, when it is not one. `source` names where it came from, for that log line."""
        if doc is None:
            return None
        try:
            return cls.from_json(doc)
        except NotAStatus as exc:
            log.warning("ignoring the status of %s: %s", source, exc)
            return None

    @classmethod
    def from_json(cls, doc: Any) -> MemberStatus:
        """Like `parse`, but raises NotAStatus (saying why) instead of returning None."""
        doc = _object(doc, "the document")
        name = doc.get("name")
        if not isinstance(name, str) or not name:
            raise NotAStatus("it has no member name")
        role = doc.get("role")
        if not isinstance(role, str) or not role:
            raise NotAStatus("it has no role")
        config = _object(doc.get("config"), "config")
        joint = config.get("joint")
        snapshot = _object(doc.get("snapshot"), "snapshot")
        archive = _object(doc.get("archive"), "archive")
        members = _object(doc.get("members"), "members")
        return cls(
            name=name, role=role,
            term=_int(doc, "term"),
            leader=_str(doc, "leader"),
            commit_index=_int(doc, "commit_index"),
            applied_index=_int(doc, "applied_index"),
            first_index=_int(doc, "first_index"),
            last_index=_int(doc, "last_index"),
            cluster_id=_str(doc, "cluster_id"),
            member_uid=_str(doc, "member_uid"),
            admission=_str(doc, "admission"),
            alarms=tuple(_names(doc, "alarms")),
            snapshot=SnapshotState(_int(snapshot, "index"), _int(snapshot, "term"),
                                   _int(snapshot, "bytes")),
            config=Configuration(
                voters=frozenset(_names(config, "voters")),
                learners=frozenset(_names(config, "learners")),
                joint=None if joint is None else Joint(
                    frozenset(_names(_object(joint, "config.joint"), "old")),
                    frozenset(_names(joint, "new"))),
                index=_int(config, "index")),
            members={str(member): _progress(member, info) for member, info in members.items()},
            archive=ArchiveState(_str(archive, "url"),
                                 _int(archive, "last_snapshot_index", None),
                                 _int(archive, "last_archived_index", None),
                                 _str(archive, "error")),
        )


def _progress(name: str, info: Any) -> Progress:
    info = _object(info, f"members.{name}")
    return Progress(role=_str(info, "role") or "unknown",
                    match_index=_int(info, "match_index", None),
                    peer_url=_str(info, "peer_url"), client_url=_str(info, "client_url"))


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise NotAStatus(f"{what} is not an object ({type(value).__name__})")
    return value


def _int(doc: Mapping[str, Any], key: str, default: int | None = 0) -> Any:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotAStatus(f"{key} is not a whole number ({value!r})")
    return value


def _str(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None or isinstance(value, str):
        return value
    raise NotAStatus(f"{key} is not a string ({value!r})")


def _names(doc: Mapping[str, Any], key: str) -> list[str]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NotAStatus(f"{key} is not a list of names ({value!r})")
    return value
