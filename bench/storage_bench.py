"""How fast can a member make log entries durable on this disk?

Measures, in a scratch directory on the disk under test:
- the disk's raw rate of small durable writes (one ~100-byte write + fsync, in a loop), which
  bounds everything: no log can sync more often than this;
- `DiskStorage` with group commit: one append(batch) + sync() per round, at batch sizes 1, 10
  and 100 (entries of ~100 bytes), as entries/s and syncs/s. Syncs/s close to the raw rate
  means the log adds little to the fsync; entries/s growing with the batch is group commit;
- the append path alone (no sync), which is the CPU cost per entry.

usage: .venv/bin/python bench/storage_bench.py [--dir DIR] [--seconds S]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flotilla.node.consensus.types import Entry
from flotilla.node.storage import DiskStorage

DATA = b"x" * 100


def timed_loop(seconds: float, step: Callable[[], None]) -> tuple[int, float]:
    """Run `step` until `seconds` have passed; return (iterations, elapsed seconds)."""
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        step()
        count += 1
        now = time.perf_counter()
        if now >= deadline:
            return count, now - start


def raw_sync_rate(directory: Path, seconds: float, sync: Callable[[int], None]) -> float:
    path = directory / "raw"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:

        def step() -> None:
            os.write(fd, DATA)
            sync(fd)

        count, elapsed = timed_loop(seconds, step)
    finally:
        os.close(fd)
        path.unlink()
    return count / elapsed


def group_commit_rate(directory: Path, seconds: float, batch: int, *, sync: bool = True):
    """(entries/s, syncs/s) for append(batch) [+ sync()] rounds on a fresh log."""
    data_dir = directory / f"log-{batch}-{sync}"
    log = DiskStorage(data_dir, cluster_id="bench")
    next_index = 1

    def step() -> None:
        nonlocal next_index
        now = time.time_ns() // 1_000_000  # stamped as a leader stamps a batch it appends
        log.append([Entry(i, 1, 0, DATA, now) for i in range(next_index, next_index + batch)])
        if sync:
            log.sync()
        next_index += batch

    try:
        rounds, elapsed = timed_loop(seconds, step)
    finally:
        log.close()
        shutil.rmtree(data_dir)
    return rounds * batch / elapsed, (rounds / elapsed if sync else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="scratch directory on the disk to measure")
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each row")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="flotilla-bench-", dir=args.dir))
    try:
        rows = [
            ("raw write+fsync", raw_sync_rate(scratch, args.seconds, os.fsync), None),
            (
                "raw write+fdatasync",
                raw_sync_rate(scratch, args.seconds, getattr(os, "fdatasync", os.fsync)),
                None,
            ),
        ]
        for batch in (1, 10, 100):
            entries, syncs = group_commit_rate(scratch, args.seconds, batch)
            rows.append((f"DiskStorage batch={batch}", syncs, entries))
        entries, _ = group_commit_rate(scratch, args.seconds, 100, sync=False)
        rows.append(("DiskStorage batch=100, no sync", None, entries))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"disk under test: {scratch.parent} (entries of {len(DATA)} bytes of data;")
    print("us/entry is wall time per entry, fsync included where there is one)")
    print(f"{'case':<32} {'syncs/s':>10} {'entries/s':>12} {'us/entry':>10}")
    for name, syncs, entries in rows:
        syncs_text = f"{syncs:10.0f}" if syncs else f"{'-':>10}"
        entries_text = f"{entries:12.0f}" if entries else f"{'-':>12}"
        cost_text = f"{1e6 / entries:10.1f}" if entries else f"{'-':>10}"
        print(f"{name:<32} {syncs_text} {entries_text} {cost_text}")


if __name__ == "__main__":
    main()
