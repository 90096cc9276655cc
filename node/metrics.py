"""Prometheus text exposition for one member, without a client library.

Counters and gauges are plain attributes the runtime updates on its hot path (an attribute
store, nothing more); rendering happens only when `/metrics` is scraped.
"""

from __future__ import annotations

import bisect
from typing import Any

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total}")
        lines.append(f"{name}_count {self.n}")
        return lines


class Metrics:
    def __init__(self) -> None:
        self.term = 0
        self.is_leader = False
        self.applied = 0
        self.proposals = 0
        self.snapshots_taken = 0
        self.snapshots_sent = 0
        self.snapshot_references_sent = 0
        self.snapshots_installed = {"archive": 0, "leader": 0}
        self.proposals_refused = 0
        self.appended_entries = 0
        self.disk_free_bytes = 0  # set by alarms.SpaceAlarm
        self.alarm_nospace = False
        self.fsync = Histogram(FSYNC_BUCKETS)
        self.append = Histogram(FSYNC_BUCKETS)
        self.append_batch = Histogram(BATCH_BUCKETS)

    def observe_append(self, entries: int, append_seconds: float, fsync_seconds: float) -> None:
        """One group commit: `entries` written and made durable by one fsync."""
        self.appended_entries += entries
        self.append.observe(append_seconds)
        self.fsync.observe(fsync_seconds)
        self.append_batch.observe(entries)

    def render(self, commit_index: int, role: str, peer_dials: dict[str, int] | None = None,
               snapshot_bytes_sent: int = 0, archive: Any = None, acks_beyond_sent: int = 0,
               sender_restarts: int = 0) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: Any,
                   label: str | None = None) -> None:
            """One metric: `samples` is a value, or {label value: value} for `label`."""
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"))
            if label is None:
                lines.append(f"{name} {samples}")
            else:
                lines.extend(f'{name}{{{label}="{key}"}} {value}'
                             for key, value in sorted(samples.items()))

        family("flotilla_term", "gauge", "Current Raft term.", self.term)
        family("flotilla_is_leader", "gauge", "1 if this member leads.", int(self.is_leader))
        family("flotilla_role", "gauge", "Role of this member.", {role: 1}, "role")
        family("flotilla_commit_index", "gauge", "Highest index known committed.", commit_index)
        family("flotilla_applied_index", "gauge",
               "Highest index applied to the state machine.", self.applied)
        family("flotilla_proposals_total", "counter",
               "Proposals this member accepted as leader.", self.proposals)
        family("flotilla_proposals_refused_total", "counter",
               "Writes refused because too many were already waiting (back-pressure, "
               "answered 503).", self.proposals_refused)
        family("flotilla_log_appended_entries_total", "counter",
               "Entries appended to this member's log.", self.appended_entries)
        family("flotilla_disk_free_bytes", "gauge",
               "Bytes free on the file system of the data dir (measured about once a second).",
               self.disk_free_bytes)
        family("flotilla_alarm_nospace", "gauge",
               "1 while free space is below --quota-free-bytes: client writes are refused "
               "(507).", int(self.alarm_nospace))
        family("flotilla_snapshots_taken_total", "counter", "Snapshots this member wrote.",
               self.snapshots_taken)
        family("flotilla_snapshots_sent_total", "counter",
               "Snapshots streamed by this member as leader.", self.snapshots_sent)
        family("flotilla_snapshot_bytes_sent_total", "counter",
               "Snapshot payload bytes this member streamed to followers.", snapshot_bytes_sent)
        family("flotilla_snapshot_references_sent_total", "counter",
               "Snapshots this leader pointed a follower to in the archive instead of "
               "streaming them.", self.snapshot_references_sent)
        family("flotilla_snapshots_installed_total", "counter",
               "Snapshots installed, by source.", self.snapshots_installed, "source")
        family("flotilla_peer_stream_dials_total", "counter",
               "Peer streams this member opened, by peer (a count that keeps rising means a "
               "flapping link).", peer_dials or {}, "peer")
        family("flotilla_peer_acks_beyond_sent_total", "counter",
               "Acknowledgements of more than this leader sent the follower, ignored (a broken "
               "or hostile peer).", acks_beyond_sent)
        family("flotilla_peer_sender_restarts_total", "counter",
               "Peer sender tasks started again after a failure (each is logged).",
               sender_restarts)
        if archive is not None:  # the Archiver, when --archive is set
            family("flotilla_archive_last_archived_index", "gauge",
                   "Highest index the archive covers with no gap, as this member last knew it "
                   "(it ships while it leads).", archive.last_archived_index)
            family("flotilla_archive_last_snapshot_index", "gauge",
                   "Newest archived snapshot.", archive.last_snapshot_index)
            family("flotilla_archive_uploads_total", "counter",
                   "Objects this member archived, by kind.", archive.uploads, "kind")
            family("flotilla_archive_errors_total", "counter",
                   "Archiving rounds that failed (retried).", archive.failures)
        lines += self.fsync.render("flotilla_fsync_seconds", "Duration of log fsyncs.")
        lines += self.append.render(
            "flotilla_append_seconds",
            "Duration of a group commit: writing a batch of entries to the log and its fsync.")
        lines += self.append_batch.render(
            "flotilla_append_batch_entries", "Entries made durable by one group commit.")
        return "\n".join(lines) + "\n"
