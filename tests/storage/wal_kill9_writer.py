"""A log writer for test_wal_kill9.py, meant to be killed with SIGKILL at a random moment.

It reopens the log in DATA_DIR, bumps the term in the hard state, then appends batches forever
with group commit (one sync per batch), sometimes rewriting the last few entries (a truncation)
and sometimes compacting. After each operation is durable it prints a line and flushes, so
whatever the test has read is a promise the log must keep after the kill:
    term T          the hard state holds term T
    durable I       entries up to I are durable
    rewrite S       the next append replaces entries from S on (a truncation, durable at
                    once, so a kill right after it may legitimately leave the log at S - 1)
    compacted C     the log's snapshot index is at least C
Entry I always carries `entry_data(I)`, so content can be checked without a transcript.

usage: python wal_kill9_writer.py DATA_DIR SEED
"""

from __future__ import annotations

import random
import sys

from flotilla.node.consensus.types import Entry, HardState
from flotilla.node.storage import DiskStorage

CLUSTER = "kill9"
SEGMENT_BYTES = 16 * 1024
KEEP_TRAILING = 100


def entry_data(index: int) -> bytes:
    return f"entry {index} ".encode() * (1 + index % 9)


def open_log(data_dir: str) -> DiskStorage:
    return DiskStorage(
        data_dir,
        cluster_id=CLUSTER,
        segment_bytes=SEGMENT_BYTES,
        keep_trailing_entries=KEEP_TRAILING,
    )


def main(data_dir: str, seed: int) -> None:
    rng = random.Random(seed)
    log = open_log(data_dir)
    state = log.recover()
    term = state.hard_state.term + 1
    log.save_hard_state(HardState(term=term, vote="writer"))
    print(f"term {term}", flush=True)
    snapshot_index = state.snapshot.index
    while True:
        last = log.last_index()
        start = last + 1
        if rng.random() < 0.1 and last - snapshot_index > 5:
            start = last + 1 - rng.randint(1, 5)  # rewrite a short suffix: a truncation
            print(f"rewrite {start}", flush=True)
        count = rng.choice((1, 1, 2, 5, 20, 64))
        log.append([Entry(i, term, 0, entry_data(i)) for i in range(start, start + count)])
        log.sync()
        print(f"durable {log.last_index()}", flush=True)
        if rng.random() < 0.02 and log.last_index() - snapshot_index > 300:
            snapshot_index = log.last_index() - 200
            log.compact(snapshot_index)
            print(f"compacted {snapshot_index}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
