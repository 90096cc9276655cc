"""When to take a snapshot: the threshold policy of Ongaro's log-compaction note.

A member snapshots to bound its log, but every snapshot rewrites the whole state, so
snapshotting too often spends more disk bandwidth on snapshots than on client writes. The ratio
rule balances the two: with ratio `u`, take a snapshot when

    log_bytes_since_last_snapshot * u > last_snapshot_bytes     (and log bytes >= floor)

so a snapshot is paid for by `1/u` times its size in fresh log. The floor keeps a small state
(whose snapshots are tiny) from being snapshotted every few entries. Two blunt rules exist
for operators who want a hard bound on the log instead: `log-bytes=N` (the log since the last
snapshot reached N bytes) and `entries=N` (it holds N entries).

Syntax (the `--snapshot-policy` flag and the RaftCluster CRD): comma-separated `name=value`
rules, tried in the order given; the first that fires wins. `ratio=U` with optional `floor=SIZE`
(default 4MiB; `floor=0` disables it), `log-bytes=SIZE`, `entries=N`. SIZE is an integer or
decimal number with an optional unit B, KiB, MiB, GiB (powers of 1024). The default policy is
`ratio=0.1,floor=4MiB`.

What the ratio rule guarantees. Let snapshots 1..k be taken, snapshot i having S_i bytes and
being taken when L_i bytes of log had accumulated since snapshot i-1 (S_0 is the snapshot the
member started from, 0 if none). If every one of them fired by the ratio rule, each firing had
u * L_i > S_{i-1}; summing over i = 1..k:

    S_1 + ... + S_k  =  (S_0 + ... + S_{k-1}) + S_k - S_0  <  u * (L_1 + ... + L_k) + S_k - S_0

so the bytes written to snapshots are at most u times the bytes written to the log, plus the
size of one snapshot (the last): total_snapshot_bytes < u * total_log_bytes + S_k (k >= 1).
The floor only adds a condition to each firing, so it never weakens this bound; what it costs
is log length, not snapshot bytes. Conversely, while the rule does not fire the log since the
last snapshot satisfies log_bytes < floor or log_bytes * u <= S_last, so it never exceeds
max(floor - 1, S_last / u) bytes before the entry that makes it fire. A snapshot fired by
`log-bytes` or `entries` is outside the bound: each adds at most its predecessor's size,
S_{i-1}, on top of it (tests/test_snapshot_policy.py checks both statements).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
DEFAULT_RATIO = Decimal("0.1")
DEFAULT_FLOOR = 4 * MiB

_UNITS = {"": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")
_EXAMPLE = "e.g. 'ratio=0.1,floor=4MiB' or 'log-bytes=64MiB,entries=10000'"


def parse_size(text: str) -> int:
    """Bytes in `64MiB`, `1.5GiB`, `512KiB`, `100B` or `4096`; ValueError otherwise."""
    match = _SIZE.fullmatch(text.strip())
    unit = match and _UNITS.get(match.group(2).lower())
    if not match or unit is None:
        if match and match.group(2).lower() in ("k", "m", "g", "kb", "mb", "gb"):
            raise ValueError(f"{text!r}: sizes are in powers of 1024, write KiB, MiB or GiB")
        raise ValueError(f"{text!r} is not a size such as 4096, 512KiB, 64MiB or 1GiB")
    exact = Decimal(match.group(1)) * unit
    if exact != exact.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(exact)


def format_size(size: int) -> str:
    for name, unit in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size and size % unit == 0:
            return f"{size // unit}{name}"
    return f"{size}B"


@dataclass(frozen=True, slots=True)
class RatioRule:
    """Fires when log_bytes * ratio > last_snapshot_bytes, once log_bytes >= floor."""

    ratio: Decimal = DEFAULT_RATIO
    floor: int = DEFAULT_FLOOR
    name = "ratio"

    def __post_init__(self) -> None:
        if not self.ratio.is_finite() or self.ratio <= 0:
            raise ValueError(f"ratio must be a number > 0, not {self.ratio}")
        if self.floor < 0:
            raise ValueError("floor must be >= 0 bytes")

    def fires(self, log_bytes: int, entries: int, snapshot_bytes: int) -> bool:
        if log_bytes < self.floor:
            return False
        exact = Fraction(self.ratio)  # exact: 0.1 means 1/10, not the nearest float
        return log_bytes * exact.numerator > snapshot_bytes * exact.denominator

    def __str__(self) -> str:
        return f"ratio={_format_decimal(self.ratio)},floor={format_size(self.floor)}"


@dataclass(frozen=True, slots=True)
class LogBytesRule:
    """Fires when the log since the last snapshot holds at least `limit` bytes."""

    limit: int
    name = "log-bytes"

    def __post_init__(self) -> None:
        if self.limit <= 0:
            raise ValueError("log-bytes must be > 0")

    def fires(self, log_bytes: int, entries: int, snapshot_bytes: int) -> bool:
        return log_bytes >= self.limit

    def __str__(self) -> str:
        return f"log-bytes={format_size(self.limit)}"


@dataclass(frozen=True, slots=True)
class EntriesRule:
    """Fires when the log since the last snapshot holds at least `limit` entries."""

    limit: int
    name = "entries"

    def __post_init__(self) -> None:
        if self.limit <= 0:
            raise ValueError("entries must be > 0")

    def fires(self, log_bytes: int, entries: int, snapshot_bytes: int) -> bool:
        return entries >= self.limit

    def __str__(self) -> str:
        return f"entries={self.limit}"


Rule = RatioRule | LogBytesRule | EntriesRule


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    rules: tuple[Rule, ...]

    def __post_init__(self) -> None:
        if not self.rules:
            raise ValueError(f"a snapshot policy needs at least one rule, {_EXAMPLE}")
        names = [rule.name for rule in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"each rule may appear once, got {', '.join(names)}")

    @classmethod
    def default(cls) -> SnapshotPolicy:
        return cls((RatioRule(),))

    @classmethod
    def parse(cls, text: str) -> SnapshotPolicy:
        """Parse the `--snapshot-policy` syntax; ValueError says what is wrong."""
        try:
            return cls._parse(text)
        except ValueError as exc:
            raise ValueError(f"bad snapshot policy {text!r}: {exc} ({_EXAMPLE})") from None

    @classmethod
    def _parse(cls, text: str) -> SnapshotPolicy:
        items: dict[str, str] = {}
        if not text.strip():
            raise ValueError("the policy is empty")
        for raw in text.split(","):
            item = raw.strip()
            name, sep, value = item.partition("=")
            name, value = name.strip().lower(), value.strip()
            if not item:
                raise ValueError("empty rule (stray comma?)")
            if not sep or not value:
                raise ValueError(f"{item!r} is not name=value")
            if name not in ("ratio", "floor", "log-bytes", "entries"):
                raise ValueError(
                    f"unknown rule {name!r}; the rules are ratio (with floor), log-bytes, entries"
                )
            if name in items:
                raise ValueError(f"{name!r} given twice")
            items[name] = value
        if "floor" in items and "ratio" not in items:
            raise ValueError("floor only applies to the ratio rule: add ratio=U")
        rules: list[Rule] = []
        for name, value in items.items():
            if name == "ratio":
                floor = parse_size(items["floor"]) if "floor" in items else DEFAULT_FLOOR
                rules.append(RatioRule(_parse_ratio(value), floor))
            elif name == "log-bytes":
                rules.append(LogBytesRule(parse_size(value)))
            elif name == "entries":
                if not (value.isascii() and value.isdigit()):
                    raise ValueError(f"entries must be a whole number, not {value!r}")
                rules.append(EntriesRule(int(value)))
        return cls(tuple(rules))

    def should_snapshot(
        self, log_bytes_since: int, entries_since: int, last_snapshot_bytes: int
    ) -> str | None:
        """The name of the first rule that fires, or None.

        `log_bytes_since` and `entries_since` count the log written since the last snapshot
        was taken (or installed); `last_snapshot_bytes` is that snapshot's size (0 if none).
        """
        for rule in self.rules:
            if rule.fires(log_bytes_since, entries_since, last_snapshot_bytes):
                return rule.name
        return None

    def __str__(self) -> str:
        return ",".join(str(rule) for rule in self.rules)


def _parse_ratio(text: str) -> Decimal:
    try:
        ratio = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"ratio must be a number such as 0.1, not {text!r}") from None
    if not ratio.is_finite() or ratio <= 0:
        raise ValueError(f"ratio must be a number > 0, not {text!r}")
    return ratio


def _format_decimal(value: Decimal) -> str:
    return format(value.normalize(), "f")
