"""The low-space alarm (etcd's NOSPACE): refuse writes while the disk still has room.

A member that runs its disk full stops (exit 3) with nothing acknowledged lost, but it stops:
the alarm is there so that it rarely comes to that. When the file system holding the data dir
has less than `--quota-free-bytes` free, the member raises NOSPACE: `/v1/status` lists it in
`alarms`, `flotilla_alarm_nospace` is 1, and client writes are refused with 507 (reads, admin
requests and snapshots, which free log space, go on). The alarm clears by itself once space
is back.

Free space comes from one `statvfs` about once a second, run off the event loop; between two
checks the bytes the log appended are subtracted, so a burst of writes raises the alarm without
waiting for the next check. The alarm is per member: each member refuses the writes that reach
it, and a leader low on space refuses every write of the cluster.
"""

from __future__ import annotations

import logging
import os

from .metrics import Metrics

log = logging.getLogger(__name__)

NOSPACE = "NOSPACE"
DEFAULT_QUOTA_FREE_BYTES = 64 << 20
CHECK_INTERVAL = 1.0  # seconds between two statvfs calls


class NoSpace(Exception):
    """A write refused while the NOSPACE alarm is raised (HTTP 507, code "no_space")."""


class SpaceAlarm:
    """The NOSPACE alarm of one data dir. `quota_free_bytes` 0 turns it off."""

    def __init__(self, data_dir: str | os.PathLike[str], quota_free_bytes: int,
                 metrics: Metrics) -> None:
        self.data_dir = os.fspath(data_dir)
        self.quota = quota_free_bytes
        self.metrics = metrics
        self.free: int | None = None  # bytes, as last measured less what was written since
        self.active = False

    def observe(self, free: int) -> None:
        """A fresh measurement (`storage.space.free_bytes` of the data dir)."""
        self.free = free
        self._update()

    def wrote(self, size: int) -> None:
        """`size` more bytes went to the data dir since the last measurement (an estimate)."""
        if self.free is not None:
            self.free -= size
            if not self.active and self.quota and self.free < self.quota:
                self._update()

    def check(self) -> None:
        """Raise NoSpace while the alarm is raised (before a write is proposed)."""
        if self.active:
            raise NoSpace(
                f"NOSPACE: the file system of this member's data dir {self.data_dir} has "
                f"{max(self.free or 0, 0)} bytes free, below --quota-free-bytes ({self.quota}), "
                "so writes are refused until space is freed; reads still work. Free space or "
                "grow the volume (POST /v1/snapshot compacts the log)")

    @property
    def alarms(self) -> list[str]:
        """The `alarms` field of `/v1/status`."""
        return [NOSPACE] if self.active else []

    def _update(self) -> None:
        free = self.free if self.free is not None else 0
        active = bool(self.quota) and free < self.quota
        if active and not self.active:
            log.warning("alarm NOSPACE raised: %d bytes free on the file system of %s, below "
                        "--quota-free-bytes (%d); client writes are refused with 507",
                        free, self.data_dir, self.quota)
        elif self.active and not active:
            log.info("alarm NOSPACE cleared: %d bytes free on the file system of %s; writes are "
                     "accepted again", free, self.data_dir)
        self.active = active
        self.metrics.disk_free_bytes = max(free, 0)
        self.metrics.alarm_nospace = active
