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
               snapshot_bytes_sent: int = 0, archive: Any = None) -> str:
        lines = [
            "# HELP flotilla_term Current Raft term.",
            "# TYPE flotilla_term gauge",
            f"flotilla_term {self.term}",
            "# HELP flotilla_is_leader 1 if this member leads.",
            "# TYPE flotilla_is_leader gauge",
            f"flotilla_is_leader {int(self.is_leader)}",
            "# HELP flotilla_role Role of this member.",
            "# TYPE flotilla_role gauge",
            f'flotilla_role{{role="{role}"}} 1',
            "# HELP flotilla_commit_index Highest index known committed.",
            "# TYPE flotilla_commit_index gauge",
            f"flotilla_commit_index {commit_index}",
            "# HELP flotilla_applied_index Highest index applied to the state machine.",
            "# TYPE flotilla_applied_index gauge",
            f"flotilla_applied_index {self.applied}",
            "# HELP flotilla_proposals_total Proposals this member accepted as leader.",
            "# TYPE flotilla_proposals_total counter",
            f"flotilla_proposals_total {self.proposals}",
            "# HELP flotilla_proposals_refused_total Writes refused because too many were "
            "already waiting (back-pressure, answered 503).",
            "# TYPE flotilla_proposals_refused_total counter",
            f"flotilla_proposals_refused_total {self.proposals_refused}",
            "# HELP flotilla_log_appended_entries_total Entries appended to this member's log.",
            "# TYPE flotilla_log_appended_entries_total counter",
            f"flotilla_log_appended_entries_total {self.appended_entries}",
            "# HELP flotilla_snapshots_taken_total Snapshots this member wrote.",
            "# TYPE flotilla_snapshots_taken_total counter",
            f"flotilla_snapshots_taken_total {self.snapshots_taken}",
            "# HELP flotilla_snapshots_sent_total Snapshots streamed by this member as leader.",
            "# TYPE flotilla_snapshots_sent_total counter",
            f"flotilla_snapshots_sent_total {self.snapshots_sent}",
            "# HELP flotilla_snapshot_bytes_sent_total Snapshot payload bytes this member "
            "streamed to followers.",
            "# TYPE flotilla_snapshot_bytes_sent_total counter",
            f"flotilla_snapshot_bytes_sent_total {snapshot_bytes_sent}",
            "# HELP flotilla_snapshot_references_sent_total Snapshots this leader pointed a "
            "follower to in the archive instead of streaming them.",
            "# TYPE flotilla_snapshot_references_sent_total counter",
            f"flotilla_snapshot_references_sent_total {self.snapshot_references_sent}",
            "# HELP flotilla_snapshots_installed_total Snapshots installed, by source.",
            "# TYPE flotilla_snapshots_installed_total counter",
        ]
        for source, count in sorted(self.snapshots_installed.items()):
            lines.append(f'flotilla_snapshots_installed_total{{source="{source}"}} {count}')
        lines += [
            "# HELP flotilla_peer_stream_dials_total Peer streams this member opened, by peer "
            "(a count that keeps rising means a flapping link).",
            "# TYPE flotilla_peer_stream_dials_total counter",
        ]
        for peer, count in sorted((peer_dials or {}).items()):
            lines.append(f'flotilla_peer_stream_dials_total{{peer="{peer}"}} {count}')
        if archive is not None:  # the Archiver, when --archive is set
            lines += [
                "# HELP flotilla_archive_last_archived_index Highest index the archive covers "
                "with no gap, as this member last knew it (it ships while it leads).",
                "# TYPE flotilla_archive_last_archived_index gauge",
                f"flotilla_archive_last_archived_index {archive.last_archived_index}",
                "# HELP flotilla_archive_last_snapshot_index Newest archived snapshot.",
                "# TYPE flotilla_archive_last_snapshot_index gauge",
                f"flotilla_archive_last_snapshot_index {archive.last_snapshot_index}",
                "# HELP flotilla_archive_uploads_total Objects this member archived, by kind.",
                "# TYPE flotilla_archive_uploads_total counter",
            ]
            for kind, count in sorted(archive.uploads.items()):
                lines.append(f'flotilla_archive_uploads_total{{kind="{kind}"}} {count}')
            lines += [
                "# HELP flotilla_archive_errors_total Archiving rounds that failed (retried).",
                "# TYPE flotilla_archive_errors_total counter",
                f"flotilla_archive_errors_total {archive.failures}",
            ]
        lines += self.fsync.render("flotilla_fsync_seconds", "Duration of log fsyncs.")
        lines += self.append.render(
            "flotilla_append_seconds",
            "Duration of a group commit: writing a batch of entries to the log and its fsync.")
        lines += self.append_batch.render(
            "flotilla_append_batch_entries", "Entries made durable by one group commit.")
        return "\n".join(lines) + "\n"
