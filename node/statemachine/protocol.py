"""The contract between a member and the state machine it replicates.

Bring your own machine by writing a class with the members of `StateMachine` and starting the
node with its import spec (`load_state_machine("myapp.counter:Counter")`); the built-in one is
`flotilla.node.statemachine.kv.KVStateMachine` (spec `kv`). docs/state-machines.md walks
through an example.

The member calls `apply` for each committed client command, in log order, exactly once per
index (entries the consensus core writes for itself, no-ops and membership changes, are not
passed on), and `query` for reads. It calls `write_snapshot` to compact the log and `restore`
to install a snapshot taken by itself or by another member.

Determinism is the whole contract: every member applies the same commands in the same order,
and must end in the same state and return the same results. So `apply` may depend only on the
current state, the index and the command bytes: no clocks, no randomness, no environment, no
iteration over unordered containers whose order can differ between processes (Python's str
hashing is randomized per process: iterate sets and dicts of str in sorted order). Anything
time-like must travel inside the command (the built-in machine's leader-stamped `ts`).
An `apply` that raises takes the member down: return an error result for bad commands instead.

Snapshots without stopping applies: the member takes snapshots while it keeps applying (see
`snapshots.py`). Any machine works with the default `fork` method: the snapshot is written by a
forked child from its copy-on-write image of the process, so `write_snapshot` needs nothing
special, except that it must not rely on threads or open connections (a forked child has only
the thread that forked). A machine that also implements `SupportsFreeze` can be snapshotted by
the `overlay` method, in a background thread of the same process, for platforms or situations
where fork is unsuitable.
"""

from __future__ import annotations

import importlib
from typing import Any, BinaryIO, Protocol, runtime_checkable


@runtime_checkable
class StateMachine(Protocol):
    """A deterministic state machine fed with committed commands.

    - `kind`: a short name recorded in snapshot files; a member refuses to restore a snapshot
      of another kind.
    - `apply(index, command)`: apply one committed command and return its result (handed to the
      client that proposed it). `index` strictly increases from call to call.
    - `write_snapshot(stream)`: write the whole state as a stream of bytes, identical on every
      member that applied the same commands (sort anything unordered).
    - `restore(stream)`: replace the whole state with the one `write_snapshot` wrote, reading
      the stream to its end.
    - `query(request)`: answer a read from local state without changing it.
    """

    kind: str

    def apply(self, index: int, command: bytes) -> Any: ...

    def write_snapshot(self, stream: BinaryIO) -> None: ...

    def restore(self, stream: BinaryIO) -> None: ...

    def query(self, request: Any) -> Any: ...


@runtime_checkable
class FrozenState(Protocol):
    """A moment of a machine's state that can be written out while the machine moves on.

    `write` may run on another thread, concurrently with `apply` and `query` on the machine;
    it writes exactly what `write_snapshot` would have written at the moment of `freeze`.
    `release` is called once, on the thread that applies, after `write` finished or failed.
    """

    def write(self, stream: BinaryIO) -> None: ...

    def release(self) -> None: ...


@runtime_checkable
class SupportsFreeze(Protocol):
    """Optional: a machine that can freeze its state cheaply (copy-on-write inside the process).

    `freeze()` is called on the applying thread and must be fast (it is a pause in applies).
    Until the returned `FrozenState` is released the machine must keep applying without
    changing anything `write` reads. Only one freeze is outstanding at a time.
    """

    def freeze(self) -> FrozenState: ...


class StateMachineLoadError(ValueError):
    """A state machine spec that cannot be turned into a state machine."""


_BUILTIN = {"kv": "flotilla.node.statemachine.kv:KVStateMachine"}
_REQUIRED = ("kind", "apply", "write_snapshot", "restore", "query")


def load_state_machine(spec: str) -> StateMachine:
    """Import and instantiate a state machine from `"package.module:Class"` (any callable that
    takes no arguments and returns a machine works, and `Class` may be dotted: `Outer.Inner`).
    `"kv"` names the built-in key-value machine.
    """
    example = "e.g. 'myapp.counter:Counter' or 'kv'"
    target = _BUILTIN.get(spec, spec)
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name.strip() or not attr_path.strip() or ":" in attr_path:
        raise StateMachineLoadError(
            f"state machine spec {spec!r} is not of the form 'module:Class' ({example})"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise StateMachineLoadError(
            f"cannot import module {module_name!r} for state machine {spec!r}: {exc}; "
            "is it installed, or on PYTHONPATH?"
        ) from exc
    except Exception as exc:  # a SyntaxError, or the module's own code failing
        raise StateMachineLoadError(
            f"importing module {module_name!r} for state machine {spec!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise StateMachineLoadError(
                f"state machine {spec!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if not callable(obj):
        raise StateMachineLoadError(
            f"state machine {spec!r} names a {type(obj).__name__}, not a class or factory"
        )
    try:
        machine = obj()
    except Exception as exc:
        raise StateMachineLoadError(
            f"state machine {spec!r} could not be constructed without arguments: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    missing = [
        name
        for name in _REQUIRED
        if not hasattr(machine, name) or (name != "kind" and not callable(getattr(machine, name)))
    ]
    if missing:
        raise StateMachineLoadError(
            f"state machine {spec!r} does not implement the StateMachine protocol: "
            f"missing {', '.join(missing)} (see flotilla.node.statemachine.protocol)"
        )
    if not isinstance(machine.kind, str) or not machine.kind:
        raise StateMachineLoadError(f"state machine {spec!r}: `kind` must be a non-empty str")
    return machine
