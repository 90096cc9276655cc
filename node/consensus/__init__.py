"""The consensus core: Raft as a deterministic object with no I/O (``flotilla.node.consensus``).

Public surface: `RaftCore` and its `Settings`, the data types in `types`, and the errors a
proposal can meet. Nothing in this package may import asyncio, sockets, files or any I/O
library; tests/consensus/test_layering.py enforces it.
"""

from .core import (
    FENCED,
    UNDECIDED,
    InvalidMembership,
    MembershipChangeInProgress,
    NotLeader,
    ProposalError,
    RaftCore,
    Settings,
    TransferInProgress,
)
from .types import (
    EMPTY_MEMBERSHIP,
    CoreStatus,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    PeerProgress,
    ReadState,
    Ready,
    RecoveredState,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
)

__all__ = [
    "EMPTY_MEMBERSHIP",
    "FENCED",
    "UNDECIDED",
    "CoreStatus",
    "Entry",
    "EntryKind",
    "HardState",
    "InvalidMembership",
    "Membership",
    "MembershipChangeInProgress",
    "Message",
    "MessageType",
    "NotLeader",
    "PeerProgress",
    "ProposalError",
    "RaftCore",
    "ReadState",
    "Ready",
    "RecoveredState",
    "Role",
    "Settings",
    "Snapshot",
    "SnapshotMeta",
    "SoftState",
    "TransferInProgress",
]
