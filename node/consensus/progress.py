"""What a leader knows about each member it replicates to.

A follower's progress is in one of three states:
- PROBE: the leader does not know where the follower's log matches its own; it sends one
  append at a time and waits for the answer (or the next heartbeat) before sending another.
- REPLICATE: the match point is known; appends are pipelined, at most `max_inflight`
  unacknowledged messages at once, with `next` advanced optimistically.
- SNAPSHOT: the follower needs entries the leader has compacted away; nothing is sent until the
  snapshot is reported installed (or failed).
Invariant: match < next.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    __slots__ = (
        "commit_sent",
        "heard_at",
        "inflight",
        "match",
        "max_inflight",
        "next",
        "pending_snapshot",
        "probe_sent",
        "read_ack",
        "recent_active",
        "sent_max",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.pending_snapshot = 0
        self.probe_sent = False
        self.recent_active = False
        # The core's tick count when the member last answered a heartbeat (see knows_leader).
        self.heard_at = 0
        self.commit_sent = 0  # the commit index last sent to the member
        self.read_ack = 0  # highest read round this member has confirmed (ReadIndex)
        # The highest index this leader has sent the member (an append's last entry, a probe's
        # index, a snapshot's index): it can acknowledge nothing beyond that.
        self.sent_max = 0
        self.max_inflight = max_inflight
        self.inflight: deque[int] = deque()  # last index of each unacknowledged append

    def __repr__(self) -> str:
        return (
            f"Progress({self.state.name} match={self.match} next={self.next} "
            f"inflight={len(self.inflight)} snap={self.pending_snapshot})"
        )

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.pending_snapshot = 0
        self.probe_sent = False
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()

    def become_snapshot(self, index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        if index > self.sent_max:
            self.sent_max = index
        self.probe_sent = False
        self.inflight.clear()

    def maybe_update(self, index: int) -> bool:
        """Record an acknowledgement of `index`; False if it tells nothing new."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        if self.next < index + 1:
            self.next = index + 1
        inflight = self.inflight
        while inflight and inflight[0] <= index:
            inflight.popleft()
        return updated

    def maybe_decrease(self, rejected: int, hint: int) -> bool:
        """Handle a rejected append whose previous index was `rejected`.

        `hint` is the leader's best guess at the last index that can match (fast backtracking:
        it skips a whole conflicting term). Returns False for a stale rejection.
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        next_ = max(min(rejected, hint + 1), self.match + 1, 1)
        if next_ == self.next:
            # Rejected just after what it acknowledged: it holds less than it did (its disk was
            # lost). Nothing lower may be sent, and sending the same again at once would only
            # be rejected again, as fast as the network allows: wait for the next heartbeat.
            return False
        self.next = next_
        self.probe_sent = False
        return True

    def sent(self, last_index: int) -> None:
        """An append ending at `last_index` has been sent."""
        if last_index > self.sent_max:
            self.sent_max = last_index
        if self.state is ProgressState.REPLICATE:
            self.next = last_index + 1
            self.inflight.append(last_index)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        return True
