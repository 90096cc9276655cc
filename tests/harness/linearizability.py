"""Linearizability checking for the key-value histories that fault tests record.

A fault test runs concurrent clients against a cluster while it kills, pauses and partitions
members, records every request as an operation with the time it was invoked and the time its
answer arrived, and asks at the end: is there one order of all operations, consistent with
real time and with a single-copy key-value store, that explains every answer? If not, the
cluster lied to some client (a stale read, a lost acknowledged write, a write applied twice).

How the check works, and why it is fast enough for ~20k operations:

* **P-compositionality** (Herlihy & Wing; Horn & Kroening, "Faster linearizability checking
  via P-compositionality"): a key-value history is linearizable iff each key's sub-history is,
  because operations on different keys commute. Each key is checked on its own.
* **Wing & Gong search with Lowe's memoisation** ("Testing for linearizability", 2017; the
  same loop as porcupine): call and return events sit in one time-ordered doubly linked list.
  At each step the candidates are the operations invoked before the first return still in
  the list (that operation must take effect no later than now); applying one lifts its two
  entries out; when no candidate can go, the search backtracks. Every (set of applied
  operations, model state) pair is visited at most once.
* **Pruning that keeps the search exact** (each argued where it is done, and checked against
  a brute-force oracle in the tests): a read that can go now goes first and alone; once the
  key holds v and some read of v is still to come while nothing left can write v again,
  nothing may change the key (so a write applied too early fails at once, not thousands of
  operations later); values that no successful read returned are folded into one.
* **Operations whose outcome is unknown** (timeouts, connection errors) may have taken effect
  at any moment after their invocation, or never ("never" is the same as "after everything
  else"). They have no completion time and no output constraint. Unknown reads constrain
  nothing and are dropped, like failed operations. An unknown write that is the only writer
  of a value some read returned did happen, before that read: it is searched as an ordinary
  operation. The others are applied just in time: only when they let a blocked candidate go,
  interchangeable ones (same effect) in invocation order, so k of them cost k + 1 states
  rather than 2**k, and a dead configuration also rules out those that applied more of them.
* **Windows**: on a key with many operations, a violation deep inside would make the search
  explore everything before it. So such keys are first checked in overlapping windows of a
  few hundred operations, each relaxed so that it can only fail if the whole history does
  (the key may hold anything at the start; operations started earlier may have taken effect
  before it; those still running at its end are treated as unknown). Violations are nearly
  always local, so they are found in a window; then the whole key is searched as usual.
* On a violation, the operations are shrunk to a small subset that still cannot be
  linearized, and printed as a timeline with the longest linearizable prefix found.

Model (per key): the key is absent or holds a value and the log index that last changed it.
``put(key, value)`` always succeeds; its output may be the ``Flotilla-Index`` of the write
(an int) or None. ``get(key)`` returns the value or None (404). ``delete(key)`` returns whether
it deleted something. ``cas(key, prev_index, value)`` is compare-and-set on the mod index
(``prev_index=0``: the key must be absent); its output is the new index (an int) or True when
it took effect, False when it was refused with 412 (the checker verifies that the precondition
really failed), and ``fail`` may be used for a 412 too (sound, but it throws that information
away). A key written by an operation whose index was not recorded has an unknown mod index;
compare-and-set against it is then accepted either way (the checker errs on the side of no
false alarms). Put values must not be None (None means absent).

Budget: ``check(..., timeout=...)`` bounds the wall time; a key whose search runs out reports
``undecided`` instead of hanging. Typical histories need a fraction of that.

Usage::

    h = History()
    op = h.invoke("client-3", "put", "k", b"v1")
    ...  # do the request
    h.ok(op, index)          # or h.fail(op) / h.unknown(op)
    ...
    add_final_reads(h, {"k": final_value, ...})   # or check_final_state(h, finals)
    result = check(h)
    assert result.ok, result.explain()
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "History",
    "KeyResult",
    "Kind",
    "Op",
    "Result",
    "Status",
    "Verdict",
    "add_final_reads",
    "check",
    "check_final_state",
    "lost_writes",
]


class Kind(enum.StrEnum):
    PUT = "put"
    GET = "get"
    DELETE = "delete"
    CAS = "cas"


class Status(enum.StrEnum):
    PENDING = "pending"  # invoked, no outcome recorded yet; checked as UNKNOWN
    OK = "ok"  # completed; the output is known
    FAIL = "fail"  # definitely did not take effect (400, 412, refused before sending)
    UNKNOWN = "unknown"  # may or may not have taken effect (timeout, connection error)


class Verdict(enum.StrEnum):
    LINEARIZABLE = "linearizable"
    VIOLATION = "not linearizable"
    UNDECIDED = "undecided"


@dataclass(eq=False)
class Op:
    """One client request. Compared by identity: two identical requests are two operations."""

    id: int
    client: Hashable
    kind: Kind
    key: Hashable
    value: Any = None  # put and cas: the value written
    prev_index: int | None = None  # cas: the expected mod index (0: key must be absent)
    invoke: float = 0.0
    complete: float | None = None  # when the answer arrived, or when the client gave up
    status: Status = Status.PENDING
    output: Any = None

    @property
    def deadline(self) -> float:
        """The latest moment the operation can have taken effect at."""
        if self.status in (Status.OK, Status.FAIL) and self.complete is not None:
            return self.complete
        return math.inf

    def call_text(self) -> str:
        key = _short(self.key)
        if self.kind is Kind.PUT:
            return f"put({key}, {_short(self.value)})"
        if self.kind is Kind.CAS:
            return f"cas({key}, prev={self.prev_index}, {_short(self.value)})"
        return f"{self.kind}({key})"

    def outcome_text(self) -> str:
        if self.status is Status.FAIL:
            return "failed"
        if self.status is not Status.OK:
            return "? (" + str(self.status) + ")"
        out = self.output
        if self.kind is Kind.GET:
            return "None (absent)" if out is None else _short(out)
        if self.kind is Kind.DELETE:
            return "deleted" if out else "not found"
        if self.kind is Kind.CAS:
            if out is False:
                return "412 precondition failed"
            return "ok" if type(out) is not int else f"ok, index {out}"
        return "ok" if type(out) is not int else f"ok, index {out}"

    def __str__(self) -> str:
        return f"#{self.id} {self.client}: {self.call_text()} -> {self.outcome_text()}"


def _short(value: Any, limit: int = 32) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class History:
    """A recorder of operations, safe to share between threads and asyncio tasks.

    Methods take a lock for a few microseconds and never await, so they can be called from
    any thread or coroutine. ``clock`` must be the same monotonic clock for every caller.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def invoke(
        self,
        client: Hashable,
        kind: Kind | str,
        key: Hashable,
        value: Any = None,
        *,
        prev_index: int | None = None,
    ) -> Op:
        """Record that ``client`` is about to send a request; returns its handle."""
        kind = Kind(kind)
        _validate_call(kind, value, prev_index)
        now = self.clock()
        with self._lock:
            op = Op(len(self._ops), client, kind, key, value, prev_index, invoke=now)
            self._ops.append(op)
        return op

    def ok(self, op: Op, output: Any = None) -> None:
        """The request completed and ``output`` is its answer (see the module docstring)."""
        self._finish(op, Status.OK, output)

    def fail(self, op: Op) -> None:
        """The request definitely did not take effect."""
        self._finish(op, Status.FAIL, None)

    def unknown(self, op: Op) -> None:
        """The request may or may not have taken effect, now or at any later time."""
        self._finish(op, Status.UNKNOWN, None)

    def _finish(self, op: Op, status: Status, output: Any) -> None:
        now = self.clock()
        with self._lock:
            if op.status is not Status.PENDING:
                raise ValueError(f"operation {op} already finished as {op.status}")
            op.complete = now
            op.output = output
            op.status = status

    def record(
        self,
        client: Hashable,
        kind: Kind | str,
        key: Hashable,
        value: Any = None,
        *,
        invoke: float,
        complete: float | None = None,
        output: Any = None,
        status: Status | str = Status.OK,
        prev_index: int | None = None,
    ) -> Op:
        """Add a finished operation with explicit times (hand-written and generated histories)."""
        kind, status = Kind(kind), Status(status)
        _validate_call(kind, value, prev_index)
        if status is not Status.OK:
            output = None  # only an ok operation has an answer
        if status in (Status.OK, Status.FAIL) and (complete is None or complete < invoke):
            raise ValueError(f"a {status} operation needs complete >= invoke")
        with self._lock:
            op = Op(len(self._ops), client, kind, key, value, prev_index, invoke, complete,
                    status, output)
            self._ops.append(op)
        return op

    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def copy(self) -> History:
        new = History(self.clock)
        with self._lock:
            new._ops = [
                Op(o.id, o.client, o.kind, o.key, o.value, o.prev_index, o.invoke, o.complete,
                   o.status, o.output)
                for o in self._ops
            ]
        return new

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)


def _validate_call(kind: Kind, value: Any, prev_index: int | None) -> None:
    if kind in (Kind.PUT, Kind.CAS) and value is None:
        raise ValueError(f"{kind} needs a value (None means absent)")
    if kind is Kind.CAS and (type(prev_index) is not int or prev_index < 0):
        raise ValueError("cas needs prev_index, an int >= 0")
    if kind in (Kind.GET, Kind.DELETE) and value is not None:
        raise ValueError(f"{kind} takes no value")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class KeyResult:
    key: Hashable
    verdict: Verdict
    op_count: int
    states: int  # (applied set, model state) pairs the search visited
    explanation: str = ""


@dataclass(frozen=True)
class Result:
    verdict: Verdict
    keys: Mapping[Hashable, KeyResult]
    elapsed: float
    problems: tuple[str, ...] = ()  # readable findings of check_final_state's direct checks

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.LINEARIZABLE

    @property
    def undecided(self) -> bool:
        return self.verdict is Verdict.UNDECIDED

    @property
    def violations(self) -> list[KeyResult]:
        return [r for r in self.keys.values() if r.verdict is Verdict.VIOLATION]

    def explain(self, max_keys: int = 3) -> str:
        n_ops = sum(r.op_count for r in self.keys.values())
        lines = [f"{self.verdict}: {len(self.keys)} keys, {n_ops} operations checked in "
                 f"{self.elapsed:.2f}s"]
        lines += self.problems
        bad = self.violations
        undecided = [r for r in self.keys.values() if r.verdict is Verdict.UNDECIDED]
        for r in bad[:max_keys]:
            lines.append(r.explanation)
        if len(bad) > max_keys:
            lines.append(f"... and {len(bad) - max_keys} more keys that are not linearizable: "
                         + ", ".join(_short(r.key) for r in bad[max_keys:]))
        if undecided:
            lines.append(f"undecided (search budget exhausted) for {len(undecided)} keys: "
                         + ", ".join(_short(r.key) for r in undecided[:10])
                         + "; raise `timeout` or record fewer concurrent or unknown operations")
        return "\n".join(lines)

    __str__ = explain


# ---------------------------------------------------------------------------------------------
# The model of one key, compiled for the search

_GET, _PUT, _DELETE, _CAS = range(4)
_CODE = {Kind.GET: _GET, Kind.PUT: _PUT, Kind.DELETE: _DELETE, Kind.CAS: _CAS}
_ABSENT = (None, None)  # state: (value, mod index or None when unknown)


class _Unobserved:
    """Stands for any value that no successful read returned: they are interchangeable."""

    def __repr__(self) -> str:
        return "<a value never read>"


_UNOBSERVED = _Unobserved()


class _Anything:
    """The value of a key at the start of a window: unknown, so any read may see anything."""

    def __repr__(self) -> str:
        return "<whatever it held before the window>"


_ANYTHING = _Anything()
_ANY_STATE = (_ANYTHING, None)
_NOTHING = object()  # "not a read" / "not a write" in the search's bookkeeping


def _step_function(ops: list[Op], optional: frozenset[int],
                   start_values: frozenset) -> Callable[[int, tuple], tuple]:
    """``step(i, state)`` -> the states op i may lead to (empty: it cannot happen now).

    Ops whose ``id()`` is in ``optional`` may also be skipped (they took effect before the
    window being checked). In a window the state starts as ``_ANY_STATE``: one of
    ``start_values``, not known which until something reads it.
    """
    observed = {op.output for op in ops if op.kind is Kind.GET and op.status is Status.OK}
    track_mod = any(op.kind is Kind.CAS for op in ops)
    code, value, prev, out, unknown, after = [], [], [], [], [], []
    for op in ops:
        c = _CODE[op.kind]
        is_unknown = op.status is not Status.OK
        v = op.value if op.value in observed else _UNOBSERVED
        index = op.output if (not is_unknown and type(op.output) is int and track_mod) else None
        code.append(c)
        value.append(v)
        prev.append(op.prev_index)
        out.append(None if is_unknown else op.output)
        unknown.append(is_unknown)
        after.append((v, index) if c in (_PUT, _CAS) else _ABSENT)
    skippable = [id(op) in optional for op in ops]

    def step(i: int, state: tuple) -> tuple:
        c = code[i]
        current = state[0]
        if c == _GET:
            if current is _ANYTHING:  # the read tells what the key held
                if out[i] is None:
                    return (_ABSENT,)
                return ((out[i], None),) if out[i] in start_values else ()
            return (state,) if current == out[i] else ()
        if c == _PUT:
            result = (after[i],)
        elif c == _DELETE:
            ok = unknown[i] or current is _ANYTHING or out[i] == (current is not None)
            result = (_ABSENT,) if ok else ()
        else:
            # compare-and-set: does the precondition hold? True, False or None (cannot tell)
            p = prev[i]
            if current is _ANYTHING:
                holds = None
            elif p == 0:
                holds = current is None
            elif current is None:
                holds = False
            else:
                holds = None if state[1] is None else state[1] == p
            if unknown[i]:
                # Not taking effect at all is the same as "later": no no-op alternative.
                result = (after[i],) if holds is not False else ()
            elif out[i] is False:
                result = (state,) if holds is not True else ()
            else:
                result = (after[i],) if holds is not False else ()
        if skippable[i] and state not in result:
            result = (*result, state)
        return result

    return step


def _unknown_after(op: Op, observed: set) -> tuple:
    """The state an unknown operation leaves when it takes effect (it has no known index)."""
    if op.kind is Kind.DELETE:
        return _ABSENT
    return (op.value if op.value in observed else _UNOBSERVED, None)


def _interchangeable(op: Op, observed: set) -> tuple:
    """Unknown operations with equal keys have identical effects (see module docstring)."""
    v = op.value if op.value in observed else _UNOBSERVED
    return (op.kind, op.prev_index, v)


# ---------------------------------------------------------------------------------------------
# The search for one key


@dataclass
class _Search:
    verdict: Verdict
    states: int
    # deepest dead end, for the explanation: the applied operations (last few, with the state
    # after each), the state there, the operation whose return was reached unapplied, and the
    # operations that were candidates at that moment.
    depth: int = 0
    tail: list[tuple[int, tuple]] = field(default_factory=list)
    state: tuple = _ABSENT
    culprit: int = -1
    pending: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # reads of the current value still to go


class _Budget:
    def __init__(self, deadline: float | None, clock: Callable[[], float], max_states: int):
        self.deadline = deadline
        self.clock = clock
        self.max_states = max_states

    def exhausted(self, states: int) -> bool:
        return states > self.max_states or (
            self.deadline is not None and self.clock() > self.deadline)


def _search(ops: list[Op], budget: _Budget, *, start_values: frozenset | None = None,
            optional: frozenset[int] = frozenset(), tail_length: int = 12) -> _Search:
    """Wing & Gong search with Lowe's memo over ``ops`` (one key; FAIL and unknown GETs gone).

    Operations with a known outcome live in a time-ordered list of call and return entries;
    applying one lifts both of its entries out. At each node of the search, the candidates to
    go next are the operations called before the first return still in the list (that one
    must go no later than now), tried in invocation order; a read that can go now goes first
    and alone. Operations with an unknown outcome are kept aside in classes of
    interchangeable ones, each class applied in invocation order, and are tried last and
    only when they enable a candidate that cannot go otherwise: just in time. Once every
    known-outcome operation is applied the unknown ones can take effect "later", so the
    search stops there. (Ordering candidates by deadline instead was measured: it explores
    several times more states on histories with slow operations.)

    The key starts absent, or, with ``start_values`` (a window), holding one of those values
    or absent.
    """
    n = len(ops)
    step = _step_function(ops, optional, start_values or frozenset())
    observed = {op.output for op in ops if op.kind is Kind.GET and op.status is Status.OK}
    deadline, finite, unknowns = _pin_unknown_writes(ops, observed, start_values or frozenset())
    initial = _ABSENT if start_values is None else _ANY_STATE
    # Bit positions: applied finite operations in one mask, applied unknown ones in another.
    # Finite operations are numbered in invocation order, so the applied set is nearly always
    # "every operation below m" plus a few more, stored compactly as (m, mask >> m).
    bitpos = [0] * n
    for pos, i in enumerate(finite):
        bitpos[i] = pos
    classes: dict[tuple, list[int]] = {}
    for pos, i in enumerate(unknowns):
        bitpos[i] = pos
        classes.setdefault(_interchangeable(ops[i], observed), []).append(i)
    members = list(classes.values())
    applied = [0] * len(members)  # each class is applied in order: a prefix of its members
    invoke = [op.invoke for op in ops]

    # Entries 1..2f: calls and returns in time order; 0 is the head and 2f+1 the tail sentinel.
    # At equal times calls come first: touching intervals count as concurrent.
    events = sorted([(ops[i].invoke, 0, i) for i in finite]
                    + [(deadline[i], 1, i) for i in finite])
    size = len(events)
    tail_entry = size + 1
    nxt = [*range(1, size + 2), tail_entry]
    prv = [0, *range(0, size + 1)]
    is_call = [False] * (size + 2)
    op_of = [0] * (size + 2)
    time_of = [0.0] * (size + 2)
    match = [0] * (size + 2)
    call_entry = [0] * n
    for e, (t, kind, i) in enumerate(events, start=1):
        is_call[e] = kind == 0
        op_of[e] = i
        time_of[e] = t
        if kind == 0:
            call_entry[i] = e
        else:
            match[call_entry[i]] = e
            match[e] = call_entry[i]

    read_only = [op.status is Status.OK and _read_only(op) for op in ops]

    by_after: dict[tuple, list[int]] = {}  # unknown classes by the state they leave
    for c, group in enumerate(members):
        by_after.setdefault(_unknown_after(ops[group[0]], observed), []).append(c)

    def head(c: int, limit: float) -> int:
        """The next member of class c, if it was invoked by ``limit``; else -1."""
        k = applied[c]
        group = members[c]
        return group[k] if k < len(group) and invoke[group[k]] <= limit else -1

    def expand() -> tuple[list[int], int]:
        """The candidates at the current node (call entries, or -1-class), and the due return.

        An unknown operation W is only worth trying when it enables another candidate C that
        cannot go now. Take any linearization with W and look at the op C right after it: if
        C is a write, its result does not depend on W, so W can be dropped (it "never took
        effect"); if C leaves the state alone and could go without W, swap them; otherwise W
        enabled C. Repeating this gives a linearization in which every applied unknown op
        enables the op right after it, which was a candidate at the same node.
        """
        e = nxt[0]
        calls = []
        while is_call[e]:
            calls.append(e)
            e = nxt[e]
        limit = time_of[e]
        if not members:
            return calls, e
        targets = [op_of[x] for x in calls if not step(op_of[x], state)]
        # If every known-outcome candidate can go now, a chain of unknown ops before one of
        # them can be dropped (writes) or moved after it (the others), so none is needed.
        wanted: set[tuple] = set()
        while targets:
            new = {after for after in by_after if after not in wanted
                   and any(step(j, after) for j in targets)}
            wanted |= new
            targets = [w for after in new for c in by_after[after]
                       if (w := head(c, limit)) >= 0 and not step(w, state)]
        for after in wanted:
            for c in by_after[after]:
                w = head(c, limit)
                if w >= 0 and step(w, state):
                    calls.append(-1 - c)
        return calls, e

    # Reads pin writes: when the key holds v, some read of v is still to go and no op left can
    # write v again, then nothing may change the state now, or that read could never go.
    # Without this, a write whose value is read much later may be applied early and
    # overwritten, and the search only finds out at that read, after exploring everything in
    # between.
    in_search = set(finite) | set(unknowns)
    read_value = [op.output if op.kind is Kind.GET and op.status is Status.OK else _NOTHING
                  for op in ops]
    write_value = [_NOTHING] * n
    for i in in_search:
        op = ops[i]
        if op.kind is Kind.DELETE:
            write_value[i] = None
        elif _writes(op):
            write_value[i] = op.value if op.value in observed else _UNOBSERVED
    reads_of: dict[Any, list[int]] = defaultdict(list)
    for i in finite:
        if read_value[i] is not _NOTHING:
            reads_of[read_value[i]].append(i)
    reads_left = Counter({v: len(reads) for v, reads in reads_of.items()})
    writers_left = Counter(v for v in write_value if v is not _NOTHING)

    def apply(cand: int, i: int) -> None:
        if cand > 0:
            _lift(cand, match, nxt, prv)
        else:
            applied[-1 - cand] += 1
        if read_value[i] is not _NOTHING:
            reads_left[read_value[i]] -= 1
        if write_value[i] is not _NOTHING:
            writers_left[write_value[i]] -= 1

    def unapply(cand: int, i: int) -> None:
        if cand > 0:
            _unlift(cand, match, nxt, prv)
        else:
            applied[-1 - cand] -= 1
        if read_value[i] is not _NOTHING:
            reads_left[read_value[i]] += 1
        if write_value[i] is not _NOTHING:
            writers_left[write_value[i]] += 1

    cache: set[tuple] = set()
    # Dead configurations by (applied known-outcome ops, state): the sets of applied unknown
    # ops they had. Having applied more unknown ops only leaves fewer options (every class is
    # applied as a prefix), so a configuration that has applied a superset is dead too.
    dead: dict[tuple, list[int]] = {}

    def fresh(base: tuple, s: tuple) -> bool:
        if (base, s) in cache:
            return False
        if base[2]:
            for m in dead.get((base[0], base[1], s), ()):
                if not m & ~base[2]:
                    return False
        return True

    # Frames: the parent node (candidates, next position, due return), then the applied op
    # (candidate, op index, untried alternatives), state and masks before it, after it, and
    # the memo key prefix after it.
    stack: list[tuple] = []
    state: tuple = initial
    lin_f = lin_u = 0
    best = _Search(Verdict.VIOLATION, 0, depth=-1)
    if nxt[0] == tail_entry:
        return _Search(Verdict.LINEARIZABLE, 0)
    candidates, due_entry = expand()
    pos = 0
    counter = 0

    while True:
        counter += 1
        if counter & 1023 == 0 and budget.exhausted(len(cache)):
            return _Search(Verdict.UNDECIDED, len(cache))
        descended = False
        frozen = reads_left[state[0]] > 0 and writers_left[state[0]] == 0
        while pos < len(candidates) and not descended:
            cand = candidates[pos]
            pos += 1
            if cand > 0:
                i = op_of[cand]
            else:
                c = -1 - cand
                i = members[c][applied[c]]
            alternatives = step(i, state)
            if frozen:
                alternatives = tuple(a for a in alternatives if a == state)
            if not alternatives:
                continue
            if cand > 0:
                new_f, new_u = lin_f | (1 << bitpos[i]), lin_u
            else:
                new_f, new_u = lin_f, lin_u | (1 << bitpos[i])
            low = ((new_f + 1) & -(new_f + 1)).bit_length() - 1
            base = (low, new_f >> low, new_u)
            if cand > 0 and read_only[i] and alternatives == (state,):
                # A read (or a refused write) that may go now: any order that puts it later
                # works just as well with it here, so nothing else is tried at this node.
                if not fresh(base, state):
                    pos = len(candidates)
                    continue
                cache.add((base, state))
                stack.append((candidates, len(candidates), due_entry, cand, i, (),
                              state, lin_f, lin_u, new_f, new_u, base))
                lin_f, lin_u = new_f, new_u
                descended = True
            for a, s in enumerate(alternatives if not descended else ()):
                if fresh(base, s):
                    cache.add((base, s))
                    stack.append((candidates, pos, due_entry, cand, i, alternatives[a + 1:],
                                  state, lin_f, lin_u, new_f, new_u, base))
                    state, lin_f, lin_u = s, new_f, new_u
                    descended = True
                    break
            if descended:
                apply(cand, i)

        if not descended:
            # Dead end: no candidate can go next. Keep the deepest one for the explanation,
            # then backtrack to the nearest frame with an untried alternative or sibling.
            if len(stack) > best.depth:
                _remember(best, stack, state, candidates, due_entry, op_of, members, applied,
                          tail_length)
                if frozen:
                    best.waiting = [i for i in reads_of[state[0]]
                                    if not (lin_f >> bitpos[i]) & 1]
            if not stack:
                best.states = len(cache)
                return best
            if members:
                top = stack[-1][11]
                dead.setdefault((top[0], top[1], state), []).append(top[2])
            (candidates, pos, due_entry, cand, i, rest, state, lin_f, lin_u, new_f, new_u,
             base) = stack.pop()
            unapply(cand, i)
            for a, s in enumerate(rest):
                if fresh(base, s):
                    cache.add((base, s))
                    stack.append((candidates, pos, due_entry, cand, i, rest[a + 1:],
                                  state, lin_f, lin_u, new_f, new_u, base))
                    state, lin_f, lin_u = s, new_f, new_u
                    descended = True
                    apply(cand, i)
                    break
            if not descended:
                continue  # try the parent's next candidate

        if nxt[0] == tail_entry:
            return _Search(Verdict.LINEARIZABLE, len(cache))
        candidates, due_entry = expand()
        pos = 0


def _pin_unknown_writes(ops: list[Op], observed: set, start_values: frozenset
                        ) -> tuple[list[float], list[int], list[int]]:
    """Deadlines, and which operations go in the entry list (finite) or aside (unknown).

    An unknown write that is the only write of a value some read returned (and the key cannot
    hold that value from the start) did take effect, before the first such read completed:
    it gets that read's completion as its deadline and is searched like any other operation.
    An unknown put of a value nobody read can matter only through delete and compare-and-set,
    which observe existence; without those on the key it is left out (as if it never took
    effect, which is always allowed).
    """
    deadline = [op.deadline for op in ops]
    writers: Counter = Counter(op.value for op in ops if op.kind in (Kind.PUT, Kind.CAS))
    first_read: dict[Any, float] = {}
    for op in ops:
        if op.kind is Kind.GET and op.status is Status.OK:
            first_read[op.output] = min(first_read.get(op.output, math.inf), op.deadline)
    existence_matters = any(op.kind in (Kind.DELETE, Kind.CAS) for op in ops)
    finite, unknowns = [], []
    for i, op in enumerate(ops):
        if op.status is not Status.OK and op.kind in (Kind.PUT, Kind.CAS):
            if (writers[op.value] == 1 and op.value not in start_values
                    and first_read.get(op.value, -math.inf) >= op.invoke):
                deadline[i] = first_read[op.value]
            elif op.value not in observed and not existence_matters:
                continue
        (finite if deadline[i] < math.inf else unknowns).append(i)
    finite.sort(key=lambda i: ops[i].invoke)
    unknowns.sort(key=lambda i: (ops[i].invoke, i))
    return deadline, finite, unknowns


def _lift(e: int, match: list[int], nxt: list[int], prv: list[int]) -> None:
    """Remove a call entry and its return from the list (dancing links)."""
    m = match[e]
    nxt[prv[e]] = nxt[e]
    prv[nxt[e]] = prv[e]
    nxt[prv[m]] = nxt[m]
    prv[nxt[m]] = prv[m]


def _unlift(e: int, match: list[int], nxt: list[int], prv: list[int]) -> None:
    """Undo ``_lift``: the removed entries still know their neighbours."""
    m = match[e]
    nxt[prv[m]] = m
    prv[nxt[m]] = m
    nxt[prv[e]] = e
    prv[nxt[e]] = e


def _remember(best: _Search, stack: list[tuple], state: tuple, candidates: list[int],
              due_entry: int, op_of: list[int], members: list[list[int]], applied: list[int],
              tail_length: int) -> None:
    """Keep the deepest dead end for the explanation (called only when a new depth is hit)."""
    best.depth = len(stack)
    best.culprit = op_of[due_entry]
    best.state = state
    frames = stack[-tail_length:]
    afters = [f[6] for f in frames[1:]] + [state] if frames else []
    best.tail = [(f[4], after) for f, after in zip(frames, afters, strict=True)]
    best.pending = [op_of[c] if c > 0 else members[-1 - c][applied[-1 - c]]
                    for c in candidates]


def _checkable(ops: Iterable[Op]) -> list[Op]:
    """Drop what constrains nothing: failed operations and reads with no answer."""
    return [
        op for op in ops
        if op.status is not Status.FAIL
        and not (op.kind is Kind.GET and op.status is not Status.OK)
    ]


def _shrink(ops: list[Op], fails: Callable[[list[Op]], bool], clock: Callable[[], float],
            seconds: float) -> list[Op]:
    """A smaller sub-history that still ``fails``, found greedily (ddmin style).

    Only removals that cannot turn a linearizable history into a non-linearizable one are
    tried, so the core proves the whole history wrong: successful reads, and writes whose value
    no remaining read returns when the key has no delete or compare-and-set (those observe
    existence, which any write provides).
    """
    stop = clock() + seconds
    core = list(ops)
    writes_removable = not any(op.kind in (Kind.DELETE, Kind.CAS) for op in ops)

    def removable(op: Op, reads_left: Counter) -> bool:
        if op.kind is Kind.GET:
            return True
        return op.kind is Kind.PUT and writes_removable and reads_left[op.value] == 0

    chunk = max(1, len(core) // 2)
    while clock() < stop:
        i = 0
        while i < len(core) and clock() < stop:
            group = core[i:i + chunk]
            reads_left = Counter(o.output for o in core if o.kind is Kind.GET)
            reads_left.subtract(o.output for o in group if o.kind is Kind.GET)
            drop = {id(op) for op in group if removable(op, reads_left)}
            if drop:
                trial = [op for op in core if id(op) not in drop]
                if trial and fails(trial):
                    core = trial
                    continue
            i += chunk
        if chunk == 1:
            break
        chunk //= 2
    return core


@dataclass(frozen=True)
class _Window:
    """A relaxation of one key's history to the operations invoked in [start, end].

    If the window admits no linearization, neither does the whole history:
    * the key may hold anything at the start (``_ANY_STATE``);
    * operations invoked before the start and still running then may have taken effect before
      it (they are optional; reads among them are left out, as they constrain nothing then);
    * operations still running at the end are treated as unknown, because operations invoked
      after the end, which are left out, may have come before them.
    A violation is usually local (a stale read shortly after the write it missed), so checking
    overlapping windows finds it without exploring the whole history before it.
    """

    start: float
    end: float
    ops: list[Op]
    optional: frozenset[int]  # id() of the optional ops
    start_values: frozenset  # what the key may hold at the start (or it is absent)

    @classmethod
    def of(cls, ops: list[Op], start: float, end: float,
           start_values: Iterable[Any] | None = None) -> _Window:
        """The window of ``ops`` (failed ones and unanswered reads already removed).

        ``start_values``: every value written by an operation invoked before ``start``;
        computed from ``ops`` when not given (then ``ops`` must include all of those).
        """
        if start_values is None:
            start_values = [op.value for op in ops if op.invoke < start and _writes(op)]
        chosen, optional = [], set()
        for op in ops:
            if op.invoke > end or op.deadline < start:
                continue
            early = op.invoke < start
            if early and _read_only(op):
                continue
            if op.status is Status.OK and op.deadline > end:
                if op.kind is Kind.GET:
                    continue
                op = replace(op, status=Status.UNKNOWN, output=None)
            if early and op.status is Status.OK:
                optional.add(id(op))
            chosen.append(op)
        return cls(start, end, chosen, frozenset(optional), frozenset(start_values))

    def search(self, ops: list[Op], budget: _Budget) -> _Search:
        return _search(ops, budget, start_values=self.start_values, optional=self.optional)


def _writes(op: Op) -> bool:
    """Whether ``op`` may have written its value (so the key may hold it afterwards)."""
    if op.status is Status.FAIL:
        return False
    return op.kind is Kind.PUT or (op.kind is Kind.CAS and not _read_only(op))


def _read_only(op: Op) -> bool:
    """Ops that never change the key: reads, and deletes or compare-and-sets that answered
    that they did nothing (outputs only count for ``ok`` operations)."""
    return op.kind is Kind.GET or (op.status is Status.OK and op.output is False
                                   and op.kind in (Kind.DELETE, Kind.CAS))


def _violated_window(ops: list[Op], budget: _Budget, size: int, max_states: int
                     ) -> tuple[_Window, _Search] | None:
    """The first of the windows of ``size`` operations (overlapping by half) that fails."""
    ordered = sorted(ops, key=lambda op: op.invoke)
    running: list[Op] = []  # invoked before the window, possibly still running at its start
    written: set = set()  # values written by operations invoked before the window
    done = 0
    for first in range(0, max(1, len(ordered) - size // 2), size // 2):
        start = ordered[first].invoke
        # (ordered[:first] may end with ops invoked at ``start`` too: they belong to both)
        written.update(op.value for op in ordered[done:first] if _writes(op))
        running = [op for op in running + ordered[done:first] if op.deadline >= start]
        done = first
        last = min(first + size, len(ordered)) - 1
        end = ordered[last].invoke
        while last + 1 < len(ordered) and ordered[last + 1].invoke == end:
            last += 1
        window = _Window.of(running + ordered[first:last + 1], start, end, written)
        found = window.search(window.ops, _Budget(budget.deadline, budget.clock, max_states))
        if found.verdict is Verdict.VIOLATION:
            return window, found
        if budget.exhausted(0):
            return None
    return None


_WINDOW = 200  # operations per window, for keys with more than twice as many


def _check_key(key: Hashable, ops: list[Op], budget: _Budget, t0: float,
               shrink_seconds: float) -> KeyResult:
    checkable = _checkable(ops)
    window = None
    if len(checkable) > 2 * _WINDOW:
        hit = _violated_window(checkable, budget, _WINDOW, max_states=200_000)
        if hit:
            window, found = hit
    if window is None:
        found = _search(checkable, budget)
        if found.verdict is not Verdict.VIOLATION:
            return KeyResult(key, found.verdict, len(ops), found.states)
        problem, search = checkable, (lambda trial: _search(trial, budget))
    else:
        problem, search = window.ops, (lambda trial: window.search(trial, budget))
    core = problem
    if shrink_seconds > 0:
        core = _shrink(problem, lambda trial: search(trial).verdict is Verdict.VIOLATION,
                       budget.clock, shrink_seconds)
    diagnosis = search(core) if len(core) < len(problem) else found
    if diagnosis.verdict is not Verdict.VIOLATION:  # budget ran out while shrinking
        core, diagnosis = problem, found
    return KeyResult(key, Verdict.VIOLATION, len(ops), found.states,
                     _explain_key(key, ops, core, diagnosis, t0, window))


def _explain_key(key: Hashable, ops: list[Op], core: list[Op], found: _Search,
                 t0: float, window: _Window | None) -> str:
    culprit = core[found.culprit]
    shown = {core[i] for i, _ in found.tail} | {core[i] for i in found.pending} | {culprit}
    if len(core) <= 40:
        shown |= set(core)
    marks = {culprit: "!!"}
    for i in found.waiting:
        marks.setdefault(core[i], "<<")
        shown.add(core[i])
    for i in found.pending:
        marks.setdefault(core[i], "..")
    lines = [
        f"key {_short(key)}: not linearizable ({len(ops)} operations on this key; these "
        f"{len(core)} already admit no linearization)"]
    if window is not None:
        lines.append(
            f"  found in the window of operations invoked from {_rel(window.start, t0)} to "
            f"{_rel(window.end, t0)}, whatever the key held before it; operations still "
            "running at its end are shown as unknown, and those started before it may have "
            "taken effect before it")
    lines.append(f"  the longest linearizable prefix found applies {found.depth} operations; "
                 "the last ones, with the value after each:")
    text = _state_text(found.tail[0][1]) if found.tail else ""
    for i, after in found.tail:
        if after[0] is not _UNOBSERVED:
            text = _state_text(after)
        elif _writes(core[i]):  # name the value, which the state does not keep
            text = f"{_short(core[i].value)} (a value no read returned)"
        lines.append(f"      #{core[i].id:<6} {core[i].call_text():<40} -> {text}")
    state_text = text if found.tail else _state_text(found.state)
    if not found.tail:
        lines.append("      (none)")
    due = ("before it completed at " + _rel(culprit.deadline, t0)
           if not math.isinf(culprit.deadline) else "before the first read of its value")
    if found.waiting:
        reads = ", ".join(str(core[i]) for i in found.waiting[:3])
        lines.append(
            f"  then the key holds {state_text}, which {reads} (marked <<) must still read, "
            f"and no other operation writes it again; so nothing may change the key yet, but "
            f"{culprit} must take effect {due}.")
    else:
        lines.append(
            f"  then the key holds {state_text}, and {culprit} must take effect {due}, but "
            "neither it nor any other operation pending then (marked ..) can be applied next.")
    lines.append("  timeline (times relative to the first operation of the history; "
                 "[==> : outcome unknown):")
    lines += _timeline(sorted(shown, key=lambda o: (o.invoke, o.id)), t0, marks)
    return "\n".join(lines)


def _state_text(state: tuple) -> str:
    value, index = state
    if value is None:
        return "absent"
    if value is _ANYTHING:
        return "whatever it held before the window"
    text = "a value no read returned" if value is _UNOBSERVED else _short(value)
    return text + ("" if index is None else f" (mod index {index})")


def _rel(t: float, t0: float) -> str:
    return "never" if math.isinf(t) else f"{t - t0:+.4f}s"


def _timeline(ops: list[Op], t0: float, marks: Mapping[Op, str], width: int = 40,
              max_rows: int = 60) -> list[str]:
    if len(ops) > max_rows:
        ops = [o for o in ops if o in marks] or ops
        ops = ops[:max_rows]
    finite = [o.invoke for o in ops] + [o.deadline for o in ops if not math.isinf(o.deadline)]
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0

    def col(t: float) -> int:
        return min(width - 1, int((t - lo) / span * (width - 1)))

    rows = []
    for op in ops:
        a = col(op.invoke)
        if math.isinf(op.deadline):
            bar = " " * a + "[" + "=" * (width - a - 2) + ">"
        else:
            b = max(col(op.deadline), a + 1)
            bar = " " * a + "[" + "=" * (b - a - 1) + "]"
        rows.append(
            f"  {marks.get(op, '  ')} #{op.id:<6} {str(op.client)[:10]:<10} "
            f"{op.call_text() + ' -> ' + op.outcome_text():<58} "
            f"{_rel(op.invoke, t0):>10} {_rel(op.deadline, t0):>10} |{bar:<{width}}|")
    return rows


# ---------------------------------------------------------------------------------------------
# Public entry points


def check(
    history: History | Iterable[Op],
    *,
    timeout: float | None = 60.0,
    max_states: int = 5_000_000,
    shrink_seconds: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> Result:
    """Decide whether ``history`` is linearizable, key by key.

    ``timeout`` (seconds, for the whole history) and ``max_states`` (per key) bound the work:
    a key that exceeds them is reported ``undecided``. A key that is not linearizable is
    shrunk for up to ``shrink_seconds`` to the operations that prove it, for the explanation.
    """
    started = clock()
    budget = _Budget(None if timeout is None else started + timeout, clock, max_states)
    ops = history.ops if isinstance(history, History) else list(history)
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    t0 = min((op.invoke for op in ops), default=0.0)
    keys: dict[Hashable, KeyResult] = {}
    shrunk = 0
    for k, kops in by_key.items():
        # Shrinking is only for the explanation, which shows the first few keys.
        keys[k] = _check_key(k, kops, budget, t0, shrink_seconds if shrunk < 3 else 0.0)
        shrunk += keys[k].verdict is Verdict.VIOLATION
    verdicts = {r.verdict for r in keys.values()}
    if Verdict.VIOLATION in verdicts:
        verdict = Verdict.VIOLATION
    elif Verdict.UNDECIDED in verdicts:
        verdict = Verdict.UNDECIDED
    else:
        verdict = Verdict.LINEARIZABLE
    return Result(verdict, keys, clock() - started)


def add_final_reads(
    history: History,
    finals: Mapping[Hashable, Any],
    *,
    client: Hashable = "final-read",
    require_all_keys: bool = True,
) -> list[Op]:
    """Record, after everything else, one successful read per key returning ``finals[key]``.

    Call it with values read once the run is over (all clients stopped, cluster healed): the
    reads then make every acknowledged write that was lost show up as a violation. With
    ``require_all_keys`` a key that was written but has no final value is an error, so a typo
    cannot silently skip the check.
    """
    ops = history.ops
    if require_all_keys:
        missing = {op.key for op in ops} - set(finals)
        if missing:
            raise KeyError(f"no final value for {len(missing)} keys, e.g. "
                           f"{_short(next(iter(missing)))}; read every key the run touched")
    latest = max([op.invoke for op in ops]
                 + [op.complete for op in ops if op.complete is not None], default=0.0)
    start = max(history.clock(), math.nextafter(latest, math.inf))
    end = math.nextafter(start, math.inf)
    return [history.record(client, Kind.GET, key, invoke=start, complete=end, output=value)
            for key, value in finals.items()]


def lost_writes(history: History | Iterable[Op], finals: Mapping[Hashable, Any]) -> list[str]:
    """Direct, readable evidence of acknowledged writes that the final state does not reflect.

    A write acknowledged after every write of the final value had completed must have taken
    effect after all of them, so the final value cannot be theirs. (Linearizability with the
    final reads implies all of this; this finds the common case quickly and says it plainly.)
    """
    ops = history.ops if isinstance(history, History) else list(history)
    t0 = min((op.invoke for op in ops), default=0.0)
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    problems = []
    for key, final in finals.items():
        kops = by_key.get(key, [])
        applied = [o for o in kops if (o.kind is Kind.DELETE and o.status is not Status.FAIL)
                   or _writes(o)]
        acknowledged = [o for o in applied if o.status is Status.OK and o.kind is not Kind.GET]
        if final is None:
            producers = [o for o in applied if o.kind is Kind.DELETE]
        else:
            producers = [o for o in applied if o.kind in (Kind.PUT, Kind.CAS)
                         and o.value == final]
            if not producers:
                problems.append(f"key {_short(key)}: the final value {_short(final)} was never "
                                "written by any put or compare-and-set that could have applied")
                continue
        horizon = max((o.deadline for o in producers), default=-math.inf)
        what = "absent" if final is None else _short(final)
        lost = [
            o for o in acknowledged
            if o.invoke > horizon and not (
                o.kind is Kind.DELETE if final is None
                else o.kind is not Kind.DELETE and o.value == final)
        ]
        for o in lost[-3:]:
            problems.append(
                f"key {_short(key)}: acknowledged write lost: {o} (invoked at "
                f"{_rel(o.invoke, t0)}, acknowledged at {_rel(o.deadline, t0)}) started "
                f"after every operation that could leave the key {what} had finished, yet "
                f"the final read finds it {what}")
        if len(lost) > 3:
            problems.append(f"key {_short(key)}: ... and {len(lost) - 3} earlier acknowledged "
                            "writes lost the same way")
    return problems


def check_final_state(
    history: History,
    finals: Mapping[Hashable, Any],
    **check_options: Any,
) -> Result:
    """``check`` the history plus final reads, and report lost writes in plain words first.

    ``history`` itself is not modified.
    """
    problems = tuple(lost_writes(history, finals))
    with_finals = history.copy()
    add_final_reads(with_finals, finals)
    result = check(with_finals, **check_options)
    if problems:
        return Result(Verdict.VIOLATION, result.keys, result.elapsed, problems)
    return result
