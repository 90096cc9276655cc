"""The member's state machine, made from its `--state-machine` spec wherever a member needs one.

A member makes machines in several places: at start (empty, or from its newest snapshot), for
a snapshot a leader streams or the archive holds (restored into a fresh machine, checked, and
only then swapped in), and when it restores a new cluster from an archive. All of them go
through one `MachineFactory`, so they all make the configured machine, and all refuse a
snapshot another kind of machine wrote: the kind is recorded in every snapshot file's header.

A data dir records the kind its member runs (`state-machine.json`, written at its first start):
a member started with another machine refuses it before applying anything, even while it has
no snapshot yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

from flotilla.node.storage import DataDirError
from flotilla.node.storage.fsutil import write_atomic

from .protocol import StateMachine, load_state_machine

#: The file in a data dir that names the kind of machine its member runs.
KIND_FILE = "state-machine.json"


class MachineMismatch(DataDirError):
    """A snapshot or data dir written by another kind of state machine (exit 3 at start)."""


class MachineFactory:
    """Makes fresh machines from a spec (`module:Class`, or `kv`). The spec is loaded once
    here, so a bad one fails at once (StateMachineLoadError, a ValueError)."""

    def __init__(self, spec: str = "kv") -> None:
        self.spec = spec
        self.kind = load_state_machine(spec).kind

    def describe(self) -> str:
        return self.spec if self.spec == self.kind else f"{self.spec} (kind {self.kind!r})"

    def new(self) -> StateMachine:
        return load_state_machine(self.spec)

    def restored(self, payload: BinaryIO) -> StateMachine:
        """A fresh machine restored from a snapshot payload (a `PayloadReader`: it knows the
        kind its header records, and the file). MachineMismatch if another kind wrote it."""
        kind = getattr(payload, "kind", self.kind)
        if kind != self.kind:
            where = getattr(payload, "path", "the snapshot")
            raise MachineMismatch(
                f"{where} is a snapshot of the {kind!r} state machine, but this member runs "
                f"{self.describe()}: start it with the --state-machine that wrote it")
        machine = self.new()
        machine.restore(payload)
        return machine

    def check_data_dir(self, root: Path, *, fsync: bool = True) -> None:
        """Record the machine's kind in data dir `root` at its first start, and refuse (with
        MachineMismatch) a data dir whose record names another kind."""
        path = Path(root) / KIND_FILE
        try:
            recorded = json.loads(path.read_text()).get("kind")
        except FileNotFoundError:
            write_atomic(path, json.dumps({"kind": self.kind}).encode() + b"\n", fsync=fsync)
            return
        except (ValueError, AttributeError, OSError) as exc:
            raise DataDirError(f"{path} is unreadable ({exc}): it should name the state "
                               "machine kind this data dir holds, e.g. {\"kind\": \"kv\"}"
                               ) from None
        if recorded != self.kind:
            raise MachineMismatch(
                f"{path}: this data dir holds the state of a {recorded!r} state machine, but "
                f"this member runs {self.describe()}: start it with the --state-machine that "
                "wrote it, or use another data dir")
