"""State machines a member replicates: the protocol, the built-in key-value machine, and
snapshots taken without stopping applies (``flotilla.node.statemachine``)."""

from .kv import (
    Command,
    GetQuery,
    KVStateMachine,
    ListQuery,
    decode_command,
    encode_delete,
    encode_put,
)
from .protocol import (
    FrozenState,
    StateMachine,
    StateMachineLoadError,
    SupportsFreeze,
    load_state_machine,
)
from .snapshots import (
    FileTarget,
    SnapshotError,
    SnapshotJob,
    SnapshotResult,
    SnapshotTarget,
    choose_method,
    restore_snapshot,
    start_snapshot,
    write_snapshot_now,
)

__all__ = [
    "Command",
    "FileTarget",
    "FrozenState",
    "GetQuery",
    "KVStateMachine",
    "ListQuery",
    "SnapshotError",
    "SnapshotJob",
    "SnapshotResult",
    "SnapshotTarget",
    "StateMachine",
    "StateMachineLoadError",
    "SupportsFreeze",
    "choose_method",
    "decode_command",
    "encode_delete",
    "encode_put",
    "load_state_machine",
    "restore_snapshot",
    "start_snapshot",
    "write_snapshot_now",
]
