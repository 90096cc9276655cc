"""Group commit under SIGKILL: whatever a writer said was durable is there after the kill.

A subprocess (wal_kill9_writer.py) appends, truncates and compacts with one sync per batch,
printing each durable index; the test kills it at a seeded random moment, reopens the log,
checks every promise, and lets the next round resume writing in the same directory, so later
rounds recover from earlier kills too.

SIGKILL does not drop the page cache, so this proves the process-crash half of the story (no
state kept only in the process, recovery of whatever a kill mid-write leaves, including mid-
rotation and mid-truncation); the power-cut half is the byte-level damage of test_wal_recovery.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from flotilla.node.storage import DiskStorage

from tests.storage.wal_kill9_writer import CLUSTER, KEEP_TRAILING, SEGMENT_BYTES, entry_data

WRITER = Path(__file__).with_name("wal_kill9_writer.py")
ROUNDS = 10


def run_and_kill(data_dir: Path, seed: int, delay: float) -> list[str]:
    """Start a writer, SIGKILL it `delay` seconds after it is up; return its complete lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), str(data_dir), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    lines: list[str] = []
    started = threading.Event()

    def drain() -> None:  # keep the pipe empty so the writer never blocks on it
        for raw in writer.stdout:
            if raw.endswith(b"\n"):
                lines.append(raw.decode().strip())
                started.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert started.wait(10), f"writer did not start: {writer.stderr.read().decode()}"
    time.sleep(delay)
    assert writer.poll() is None, f"writer died on its own: {writer.stderr.read().decode()}"
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    reader.join(10)
    writer.stdout.close()
    writer.stderr.close()
    return lines


def test_everything_reported_durable_survives_sigkill(tmp_path):
    rng = random.Random(20240611)
    data_dir = tmp_path / "member"
    last_term = 0
    for round_number in range(ROUNDS):
        lines = run_and_kill(data_dir, rng.randrange(1 << 30), rng.uniform(0.05, 0.6))
        terms = [int(line.split()[1]) for line in lines if line.startswith("term ")]
        durable = [int(line.split()[1]) for line in lines if line.startswith("durable ")]
        compacted = [int(line.split()[1]) for line in lines if line.startswith("compacted ")]
        assert terms == [last_term + 1], lines[:3]
        assert durable, f"round {round_number}: the writer made no progress before the kill"
        last_term = terms[0]
        promised = durable[-1]
        if lines[-1].startswith("rewrite "):  # killed between a truncation and its append
            promised = int(lines[-1].split()[1]) - 1

        log = DiskStorage(
            data_dir,
            cluster_id=CLUSTER,
            segment_bytes=SEGMENT_BYTES,
            keep_trailing_entries=KEEP_TRAILING,
        )
        state = log.recover()
        assert state.hard_state.term == last_term
        assert log.last_index() >= promised, f"round {round_number}: lost durable entries"
        if compacted:
            assert state.snapshot.index >= compacted[-1]
        first = log.first_index()
        assert first <= state.snapshot.index + 1
        stored = log.entries(first, log.last_index() + 1)
        assert [e.index for e in stored] == list(range(first, log.last_index() + 1))
        assert all(e.data == entry_data(e.index) for e in stored)
        assert all(a.term <= b.term <= last_term for a, b in itertools.pairwise(stored))
        assert state.entries == [e for e in stored if e.index > state.snapshot.index]
        log.close()
