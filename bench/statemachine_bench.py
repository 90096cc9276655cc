"""Benchmark of the key-value state machine's snapshots (run: python bench/statemachine_bench.py).

Measures, for a machine of `--keys` keys (16-byte keys, 100-byte values):
- snapshot write and restore throughput (MB/s of snapshot file, fsync included in the write);
- per-command apply latency (microseconds, p50/p99/max over `--applies` applies) with no
  snapshot running, and while a snapshot of the whole machine is being written by the fork
  method and by the overlay method; plus the pauses each method adds at its start and end.

Applies are issued back to back (the apply thread is never idle), which flatters the overlay
method: an idle apply thread would wait for the writer thread to give up the GIL.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import select
import statistics
import tempfile
import time

from flotilla.node.statemachine import (
    FileTarget,
    KVStateMachine,
    encode_put,
    restore_snapshot,
    start_snapshot,
    write_snapshot_now,
)

KEY_BYTES = 16
VALUE_BYTES = 100


def make_key(i: int) -> str:
    return f"k{(i * 2654435761) % (1 << 64):015x}"[:KEY_BYTES]


def populate(kv: KVStateMachine, keys: int) -> int:
    blob = os.urandom(VALUE_BYTES * 4096)
    index = 0
    for i in range(keys):
        index += 1
        offset = (i % 4096) * VALUE_BYTES
        kv.apply(index, encode_put(make_key(i), blob[offset : offset + VALUE_BYTES], ts=index))
    return index


def workload(count: int, keys: int, rng: random.Random, ts: int) -> list[bytes]:
    """80% overwrites of existing keys, 20% new keys; every fourth carries a client session."""
    value = os.urandom(VALUE_BYTES)
    commands = []
    for n in range(count):
        key = make_key(rng.randrange(keys)) if rng.random() < 0.8 else f"new-{n:011d}"
        session = {"client": f"c{n % 64}", "seq": n + 1} if n % 4 == 0 else {}
        commands.append(encode_put(key, value, ts=ts + n, **session))
    return commands


def timed_applies(kv: KVStateMachine, first_index: int, commands: list[bytes], job=None):
    """Apply commands back to back, timing each; poll `job` every 256 applies. Returns the
    latencies (ns) of the applies made while the job was still running (all, without a job)."""
    clock = time.perf_counter_ns
    latencies = []
    index = first_index
    apply = kv.apply
    for n, command in enumerate(commands):
        start = clock()
        apply(index, command)
        latencies.append(clock() - start)
        index += 1
        if job is not None and n % 256 == 255 and job.poll() is not None:
            break
    return latencies, index


def stats(latencies_ns: list[int]) -> tuple[float, float, float]:
    q = statistics.quantiles(latencies_ns, n=100, method="inclusive")
    return q[49] / 1000, q[98] / 1000, max(latencies_ns) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--applies", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="where snapshot files go (default: a tmp dir)")
    args = parser.parse_args()
    rng = random.Random(42)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        started = time.perf_counter()
        kv = KVStateMachine()
        index = populate(kv, args.keys)
        elapsed = time.perf_counter() - started
        print(f"populated {args.keys:,} keys by applying puts in {elapsed:.1f} s", flush=True)
        gc.collect()

        sync = write_snapshot_now(kv, FileTarget(os.path.join(tmp, "sync.snap")))
        mb = sync.facts["size"] / 1e6
        rows.append(("snapshot size", f"{mb:.1f} MB"))
        rows.append(
            ("snapshot write (sync, fsync)", f"{mb / sync.seconds:.0f} MB/s ({sync.seconds:.2f} s)")
        )
        restored = KVStateMachine()
        t0 = time.perf_counter()
        with open(sync.facts["path"], "rb", buffering=1 << 20) as stream:
            restore_snapshot(restored, stream, "kv")
        restore_s = time.perf_counter() - t0
        rows.append(("snapshot restore", f"{mb / restore_s:.0f} MB/s ({restore_s:.2f} s)"))
        assert len(restored) == len(kv)
        del restored
        gc.collect()

        commands = workload(args.applies, args.keys, rng, ts=index + 1)
        latencies, index = timed_applies(kv, index + 1, commands)
        p50, p99, worst = stats(latencies)
        rows.append(
            (
                "apply, no snapshot",
                f"p50 {p50:.1f} us  p99 {p99:.1f} us  max {worst:.0f} us  (n={len(latencies):,})",
            )
        )

        for method in ("fork", "overlay"):
            commands = workload(args.applies, args.keys, rng, ts=index + 1)
            gc.collect()
            t0 = time.perf_counter()
            target = FileTarget(os.path.join(tmp, f"{method}.snap"))
            job = start_snapshot(kv, target, method=method)
            start_pause = time.perf_counter() - t0
            latencies, index = timed_applies(kv, index, commands, job)
            end_pause = 0.0
            result = job.poll()
            while result is None:
                select.select([job.fileno()], [], [])
                t0 = time.perf_counter()
                result = job.poll()  # for overlay, this folds the overlay back: a pause
                end_pause = time.perf_counter() - t0
            during = len(latencies)
            p50, p99, worst = stats(latencies)
            rows.append(
                (
                    f"apply during {method} snapshot",
                    f"p50 {p50:.1f} us  p99 {p99:.1f} us  max {worst:.0f} us  (n={during:,})",
                )
            )
            rows.append(
                (
                    f"  {method}: pause at start / at finish",
                    f"{start_pause * 1000:.1f} ms / {end_pause * 1000:.1f} ms; "
                    f"write {result.facts['size'] / 1e6 / result.seconds:.0f} MB/s "
                    f"({result.seconds:.2f} s)",
                )
            )
    width = max(len(name) for name, _ in rows)
    print(f"{'measure'.ljust(width)}  value")
    print(f"{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"total {time.perf_counter() - started:.1f} s; {os.cpu_count()} CPUs, load average {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
