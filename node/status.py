"""A member's status, typed: built once from the core's `CoreStatus` and the member's own
facts, and turned into the `/v1/status` document at the HTTP boundary (`to_json`).

The document's shape is part of the contract (docs/api.md); the operator parses it back into
its own typed view (operator/members.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member of the configuration, as this member sees it."""

    peer_url: str | None
    client_url: str | None
    role: str  # "leader", "follower" or "learner"
    match_index: int | None  # known only to the leader


@dataclass(frozen=True, slots=True)
class ConfigView:
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    joint_old: tuple[str, ...] | None  # the outgoing voters while the configuration is joint
    index: int  # where the configuration is in the log; a change runs while above commit


@dataclass(frozen=True, slots=True)
class ArchiveView:
    url: str | None
    last_snapshot_index: int | None
    last_archived_index: int | None
    error: str | None


NO_ARCHIVE = ArchiveView(None, None, None, None)


@dataclass(frozen=True, slots=True)
class MemberStatus:
    name: str
    cluster_id: str
    # Random per data dir: a member whose volume was replaced, or a removed member back on
    # its old volume, is told apart from the member the cluster knew by this alone.
    member_uid: str
    # None, or why this member does not vote yet: "undecided" (it started empty and has not
    # yet read the configuration that shows whether it is new) or "fenced" (the cluster counts
    # it as a voter although it started empty: remove it and add it back as a learner).
    admission: str | None
    role: str  # "leader", "follower", "candidate", "pre-candidate" or "learner"
    term: int
    leader: str | None
    commit_index: int
    applied_index: int
    # ("NOSPACE",) while free space on the data dir's file system is below --quota-free-bytes
    # and client writes are refused (507): see alarms.py.
    alarms: tuple[str, ...]
    first_index: int
    last_index: int
    snapshot_index: int
    snapshot_term: int
    snapshot_bytes: int
    config: ConfigView
    members: dict[str, MemberView]
    archive: ArchiveView

    def to_json(self) -> dict[str, Any]:
        """The `/v1/status` document."""
        config = self.config
        return {
            "name": self.name,
            "cluster_id": self.cluster_id,
            "member_uid": self.member_uid,
            "admission": self.admission,
            "role": self.role,
            "term": self.term,
            "leader": self.leader,
            "commit_index": self.commit_index,
            "applied_index": self.applied_index,
            "alarms": list(self.alarms),
            "first_index": self.first_index,
            "last_index": self.last_index,
            "snapshot": {"index": self.snapshot_index, "term": self.snapshot_term,
                         "bytes": self.snapshot_bytes},
            "config": {
                "voters": list(config.voters),
                "learners": list(config.learners),
                "joint": None if config.joint_old is None else {
                    "old": list(config.joint_old), "new": list(config.voters)},
                "index": config.index,
            },
            "members": {name: {"peer_url": m.peer_url, "client_url": m.client_url,
                               "role": m.role, "match_index": m.match_index}
                        for name, m in self.members.items()},
            "archive": {"url": self.archive.url,
                        "last_snapshot_index": self.archive.last_snapshot_index,
                        "last_archived_index": self.archive.last_archived_index,
                        "error": self.archive.error},
        }
