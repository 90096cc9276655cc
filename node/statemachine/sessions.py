"""Client sessions: what makes a retried command apply once (Raft dissertation, section 6.3).

A client tags each command with its id and a sequence number that grows with each new request.
For every client the table keeps the results of its recent sequence numbers, so a retry is
answered with the FIRST outcome instead of being applied again.

Rules, for a command (client, seq) against that client's session `s`:
- no session, or seq > s.last_seq: a new request; apply it and record its result.
- seq is in `s.results`: a retry; answer the recorded result, apply nothing.
- s.last_seq - window < seq <= s.last_seq but not recorded: a request that was overtaken by a
  later one (a pipelining client); it was never applied, so apply and record it now.
- seq <= s.last_seq - window: too old to tell; answer `stale_sequence`, apply nothing.
Invariant: `s.results` holds every applied seq in (s.last_seq - window, s.last_seq], ascending.
So "seq in that range and not recorded" proves the seq was never applied.

Expiry must be decided by the log, never by a member's wall clock, or members would disagree
about which sessions exist. Each command carries a timestamp stamped by the leader that
proposed it; the table's `clock` is the largest timestamp seen (so it never runs backwards when
leadership moves to a member whose clock is behind), and a session whose last activity is more
than `ttl_ms` behind that clock is dropped while applying. A client idle longer than the TTL
loses its exactly-once guarantee: its next command starts a new session.

Invariant: `_sessions` is ordered by `last_active`, oldest first (every touch moves a session to
the end with the current clock, and the clock never decreases), so expiry pops from the front
in O(1) per dropped session.

Sessions are immutable values, replaced on every touch: a snapshot writer can hold the list of
sessions of one moment while applies go on.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_SESSION_TTL_MS = 10 * 60 * 1000
DEFAULT_SESSION_WINDOW = 16


@dataclass(frozen=True, slots=True)
class Session:
    client: str
    last_seq: int
    last_active: int  # the table's clock (ms) when this client last sent a command
    results: tuple[tuple[int, Any], ...]  # (seq, result) of recent applied seqs, ascending


class SessionTable:
    __slots__ = ("_sessions", "clock", "ttl_ms", "window")

    def __init__(
        self, ttl_ms: int = DEFAULT_SESSION_TTL_MS, window: int = DEFAULT_SESSION_WINDOW
    ) -> None:
        if ttl_ms <= 0 or window <= 0:
            raise ValueError("session ttl_ms and window must be positive")
        self.ttl_ms = ttl_ms
        self.window = window
        self.clock = 0
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, client: str) -> Session | None:
        return self._sessions.get(client)

    def advance(self, ts: int) -> None:
        """Move the clock to a command's timestamp (if later) and drop sessions idle too long."""
        if ts > self.clock:
            self.clock = ts
        sessions = self._sessions
        horizon = self.clock - self.ttl_ms
        while sessions:
            oldest = next(iter(sessions.values()))
            if oldest.last_active >= horizon:
                break
            sessions.popitem(last=False)

    def prior_outcome(self, client: str, seq: int, index: int) -> dict[str, Any] | None:
        """The answer to a command that must not be applied, or None if it must be applied."""
        session = self._sessions.get(client)
        if session is None or seq > session.last_seq:
            return None
        for recorded_seq, result in session.results:
            if recorded_seq == seq:
                self._touch(session, session.last_seq, session.results)
                return result
        if seq > session.last_seq - self.window:
            return None  # overtaken by a later seq, never applied
        self._touch(session, session.last_seq, session.results)
        return {"index": index, "error": "stale_sequence", "last_seq": session.last_seq}

    def record(self, client: str, seq: int, result: dict[str, Any]) -> None:
        """Remember the result of a command that was just applied."""
        session = self._sessions.get(client)
        if session is None:
            self._touch(Session(client, seq, 0, ()), seq, ((seq, result),))
            return
        last_seq = max(session.last_seq, seq)
        floor = last_seq - self.window
        results = sorted((*session.results, (seq, result)), key=_seq_of)
        self._touch(session, last_seq, tuple(r for r in results if r[0] > floor))

    def _touch(self, session: Session, last_seq: int, results: tuple[tuple[int, Any], ...]) -> None:
        self._sessions[session.client] = Session(session.client, last_seq, self.clock, results)
        self._sessions.move_to_end(session.client)

    def frozen(self) -> list[Session]:
        """The sessions of this moment, in snapshot order: by (last_active, client)."""
        return sorted(self._sessions.values(), key=snapshot_order)

    def load(self, clock: int, sessions: list[Session]) -> None:
        """Replace the table's contents (sessions must be in snapshot order)."""
        self.clock = clock
        self._sessions = OrderedDict((s.client, s) for s in sessions)

    def check_invariants(self) -> None:
        last = None
        for client, session in self._sessions.items():
            assert client == session.client
            assert last is None or last <= session.last_active, "sessions out of activity order"
            last = session.last_active
            assert session.last_active <= self.clock
            seqs = [seq for seq, _ in session.results]
            assert seqs == sorted(set(seqs)), "session results not ascending"
            assert all(session.last_seq - self.window < s <= session.last_seq for s in seqs)
            assert session.last_seq in seqs, "the last seq's result must be kept"


def _seq_of(item: tuple[int, Any]) -> int:
    return item[0]


def snapshot_order(session: Session) -> tuple[int, str]:
    return session.last_active, session.client
