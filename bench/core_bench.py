"""Entries committed per second through a 3-member in-memory cluster of consensus cores.

No disk, no network, no faults: this measures the core's own cost per committed entry, with
the caller's loop as the simulator runs it (take a Ready, "persist" it, deliver its messages,
apply, advance). Usage: python bench/core_bench.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import random
import time

from flotilla.node.consensus import (
    Membership,
    RaftCore,
    RecoveredState,
    Role,
    Settings,
    SnapshotMeta,
)


def wall_clock_ms() -> int:
    """The clock the node injects: leaders stamp every entry they append with it."""
    return time.time_ns() // 1_000_000


def build(names: list[str]) -> dict[str, RaftCore]:
    membership = Membership(voters=frozenset(names))
    return {
        name: RaftCore(name, Settings(rng=random.Random(i), wall_clock_ms=wall_clock_ms),
                       RecoveredState(snapshot=SnapshotMeta(0, 0, membership)))
        for i, name in enumerate(names)
    }


def pump(cores: dict[str, RaftCore]) -> int:
    """Carry out every pending Ready and deliver every message until quiet; count applies."""
    applied = 0
    busy = True
    while busy:
        busy = False
        inbox = []
        for core in cores.values():
            if core.has_ready():
                busy = True
                rd = core.ready()
                inbox.extend(rd.messages)
                inbox.extend(rd.persisted_messages)
                applied += len(rd.committed_entries)
                core.advance(rd)
        for m in inbox:
            cores[m.to].step(m)
    return applied


def run(batch: int, seconds: float, size: int) -> tuple[float, int]:
    cores = build([f"n{i}" for i in range(size)])
    leader = cores["n0"]
    leader.campaign()
    pump(cores)
    assert leader.role is Role.LEADER
    payload = [b"x" * 100] * batch
    committed = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        leader.propose_many(payload)
        committed += pump(cores)
    elapsed = time.perf_counter() - start
    return committed / size / elapsed, leader.log.committed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(f"{'members':>7} {'batch':>6} {'entries committed/s':>20}")
    for size in (3,):
        for batch in (1, 16, 256):
            rate, _ = run(batch, args.seconds, size)
            print(f"{size:>7} {batch:>6} {rate:>20,.0f}")


if __name__ == "__main__":
    main()
