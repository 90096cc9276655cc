"""From a time to an index: the last archived entry stamped at or before a time T.

Pure: it reads a `Manifest` (and, at most, the entries of one segment), never the store. The
manifest knows the time of a few indexes: the first and last entry of each segment
(`first_ts_ms`, `last_ts_ms`) and each snapshot's index (`ts_ms`). Times never decrease along
the log, so those points bracket the answer: it is an exact point, or it lies inside one segment,
which is the only object to read to pin it down (Kafka's time index works the same way, one
level coarser). `--restore-time` and the pipeline's `--time` both go through `locate`, so they
agree with each other and with every member (an entry's time is part of the log).

What can be targeted: the state after any restorable index (see `Manifest.restorable_ranges`)
whose time is known. Each run of restorable indexes spans the times from its first index's to
its last index's, inclusive. A time before the first run, after the last, or between two runs
(entries the archive lacks) is refused with `TimeOutsideArchive`, which names the restorable
times: never silently moved to the nearest point. Entries that are not in the archive are not
seen: at the last archived entry's time, an unarchived entry stamped in the same millisecond
is not counted.

A time of 0 (or a missing manifest field) means unknown: entries written by the first release
carry none, so their stretch of an archive cannot be targeted by time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flotilla.node.consensus.types import Entry

from .errors import ArchiveCorrupt, ArchiveNotFound
from .manifest import Manifest, SegmentRecord

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_ms(ts_ms: int) -> str:
    """RFC 3339 in UTC with milliseconds, as `--restore-time` takes it:
    `2026-11-25T17:00:00.250Z`."""
    moment = _EPOCH + timedelta(milliseconds=ts_ms)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ts_ms % 1000:03d}Z"


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)


def parse_time(text: str) -> int:
    """An RFC 3339 time (`2026-11-25T17:00:00.250Z`, `2026-11-25T18:00:00+01:00`) as ms since
    the epoch. The offset is required (a time without one means different instants on
    different machines); digits past the millisecond are dropped, never rounded up (the target
    stays at or before what was asked). ValueError says what is wrong."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time with an offset; write it like "
                         "2026-11-25T17:00:00.250Z or 2026-11-25T18:00:00+01:00")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    zone = offset.upper()
    try:
        moment = datetime.fromisoformat(
            f"{year}-{month}-{day}T{hour}:{minute}:{min(int(second), 59):02d}"
            + ("+00:00" if zone == "Z" else zone))
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a valid time: {exc}") from None
    millis = int((fraction or ".0")[1:4].ljust(3, "0"))
    whole = (moment - _EPOCH) // timedelta(milliseconds=1)
    if whole < 0:
        raise ValueError(f"{text!r} is before 1970")
    return whole + millis


@dataclass(frozen=True, slots=True)
class TimePoint:
    """An index whose time the manifest knows."""

    index: int
    ts_ms: int

    def describe(self) -> str:
        return f"{format_ms(self.ts_ms)} (index {self.index})"


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Restorable times, inclusive: the state after `first.index` up to that after
    `last.index`, every index between them included."""

    first: TimePoint
    last: TimePoint

    def describe(self) -> str:
        return f"{self.first.describe()} to {self.last.describe()}"


class TimeOutsideArchive(ArchiveNotFound):
    """No restorable index is the last one stamped at or before the time asked for (or the
    archive cannot tell which). `ranges` are the restorable times, oldest first."""

    def __init__(self, message: str, ts_ms: int, ranges: tuple[TimeRange, ...]) -> None:
        super().__init__(message)
        self.ts_ms = ts_ms
        self.ranges = ranges


@dataclass(frozen=True, slots=True)
class TimeTarget:
    """Where the last entry stamped at or before `ts_ms` lies (for an exclusive target T,
    `ts_ms` is T - 1: times are whole milliseconds).

    The answer is at least `low` (stamped at or before `ts_ms`) and at most `high`. When they
    are equal it is exact (`index`); otherwise every entry from `low` to `high` is in `segment`,
    which `resolve` reads to pin the answer down.
    """

    ts_ms: int
    low: int
    high: int
    segment: SegmentRecord | None = None

    @property
    def exact(self) -> bool:
        return self.low == self.high

    @property
    def index(self) -> int:
        if not self.exact:
            raise ValueError(f"the index lies in {self.low}..{self.high}: resolve() it from "
                             "the entries of its segment")
        return self.low

    def resolve(self, entries: Iterable[Entry]) -> int:
        """The index, given the entries of `segment` (any entries covering low + 1..high)."""
        if self.exact:
            return self.low
        answer = self.low
        expected = self.low + 1
        for entry in entries:
            if entry.index < expected:
                continue
            if entry.index != expected or expected > self.high:
                break
            if entry.ts_ms == 0:
                raise TimeOutsideArchive(
                    f"entry {entry.index} has no recorded time (written before entries carried "
                    f"one), so the last entry at or before {format_ms(self.ts_ms)} is unknown",
                    self.ts_ms, ())
            if entry.ts_ms > self.ts_ms:
                return answer
            answer = entry.index
            expected += 1
        if expected <= self.high:
            raise ValueError(f"entries must cover {self.low + 1}..{self.high}; they stop at "
                             f"{expected - 1}")
        return answer


def known_points(manifest: Manifest) -> dict[int, int]:
    """index -> time, for every index whose time the manifest records. Raises ArchiveCorrupt
    when two records disagree about one index's time."""
    points: dict[int, int] = {}

    def add(index: int, ts_ms: int | None, what: str) -> None:
        if not ts_ms:
            return
        seen = points.setdefault(index, ts_ms)
        if seen != ts_ms:
            raise ArchiveCorrupt(f"the manifest gives index {index} two times ({seen} and "
                                 f"{ts_ms} ms, the latter for {what})", key=what)

    for snapshot in manifest.snapshots:
        add(snapshot.index, snapshot.ts_ms, snapshot.key)
    for segment in manifest.segments:
        add(segment.first, segment.first_ts_ms, segment.key)
        add(segment.last, segment.last_ts_ms, segment.key)
    return points


def restorable_times(manifest: Manifest) -> tuple[TimeRange, ...]:
    """The times a restore can target, one range per run of restorable indexes that has
    known times, oldest first (empty if no restorable index has a known time)."""
    points = known_points(manifest)
    ranges = []
    for low, high in manifest.restorable_ranges():
        inside = sorted(index for index in points if max(low, 1) <= index <= high)
        if inside:
            ranges.append(TimeRange(TimePoint(inside[0], points[inside[0]]),
                                    TimePoint(inside[-1], points[inside[-1]])))
    return tuple(ranges)


def restorable_time_range(manifest: Manifest) -> TimeRange | None:
    """From the oldest restorable point (the oldest snapshot's time, or the first archived
    entry's) to the last archived entry's time; None if the archive knows no time. There may be
    gaps inside: `restorable_times` lists the runs."""
    ranges = restorable_times(manifest)
    return TimeRange(ranges[0].first, ranges[-1].last) if ranges else None


def locate(manifest: Manifest, ts_ms: int, *, inclusive: bool = True,
           url: str = "the archive") -> TimeTarget:
    """Where the last restorable entry stamped at or before `ts_ms` (before it, when not
    `inclusive`) lies. Raises TimeOutsideArchive, naming the restorable times, when no
    restorable index answers (`url` names the archive in the message)."""
    target = ts_ms if inclusive else ts_ms - 1
    ranges = restorable_times(manifest)
    shown = format_ms(ts_ms)

    def refuse(why: str) -> TimeOutsideArchive:
        known = "; ".join(r.describe() for r in ranges) or "none (no archived entry has a time)"
        return TimeOutsideArchive(f"{shown} cannot be restored from {url}: {why}; restorable "
                                  f"times are {known}", ts_ms, ranges)

    if not ranges:
        raise refuse("the archive records no entry times (entries archived before they "
                     "carried one)")
    runs = [r for r in ranges if r.first.ts_ms <= target]
    if not runs:
        what = "at or before" if inclusive else "before"
        raise refuse(f"no archived entry is stamped {what} it")
    run = runs[-1]
    if target > run.last.ts_ms:
        if run is ranges[-1]:
            raise refuse("it is after the last archived entry")
        raise refuse(f"it falls between index {run.last.index} and the next restorable index, "
                     "which the archive does not hold")
    points = known_points(manifest)
    inside = sorted(i for i in points if run.first.index <= i <= run.last.index)
    low = max(i for i in inside if points[i] <= target)
    above = [i for i in inside if i > low]
    if not above or above[0] == low + 1:
        return TimeTarget(target, low, low)
    high = above[0] - 1
    covering = [s for s in manifest.segments if s.first <= low + 1 and s.last >= high]
    if not covering:
        raise refuse(f"the times of indexes {low + 1}..{high} are not in the archive")
    return TimeTarget(target, low, high, min(covering, key=lambda s: s.last - s.first))
