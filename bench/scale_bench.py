"""How long `flotilla scale` takes on a local cluster: 3 -> 5 and 5 -> 3, with the leader
among the leaving members, for a few state sizes. Prints a table.

    .venv/bin/python bench/scale_bench.py [--sizes-mb 0,20,100] [--rounds 3]

Each row is the median of the rounds. With the default file archive a joining learner installs
the newest archived snapshot (taken just before) and then the tail from the leader.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from flotilla import local, scaling

VALUE = 64 * 1024


def fill(cluster: local.LocalCluster, megabytes: int) -> None:
    with cluster.client(timeout=30) as c:
        for i in range(megabytes * 1024 * 1024 // VALUE):
            c.put(f"fill/{i:06d}", bytes([i % 251]) * VALUE)
        if megabytes:
            c.snapshot()


def one_round(megabytes: int) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    try:
        cluster, _ = local.up(root, 3, election_timeout_ms=500, heartbeat_ms=50)
        fill(cluster, megabytes)
        began = time.monotonic()
        scaling.scale(root, 5)
        up = time.monotonic() - began
        cluster = local.LocalCluster.load(root)
        with cluster.client(timeout=10) as c:
            c.transfer_leader("n5")
        began = time.monotonic()
        scaling.scale(root, 3)
        down = time.monotonic() - began
        local.LocalCluster.load(root).stop(timeout=10)
        return up, down
    finally:
        if local.LocalCluster.exists(root):
            local.LocalCluster.load(root).stop(timeout=5)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="0,20,100")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'state MB':>9} {'3 -> 5 s':>9} {'5 -> 3 s':>9}  (median of {args.rounds})")
    for size in (int(s) for s in args.sizes_mb.split(",")):
        results = [one_round(size) for _ in range(args.rounds)]
        print(f"{size:>9} {statistics.median(r[0] for r in results):>9.2f} "
              f"{statistics.median(r[1] for r in results):>9.2f}", flush=True)


if __name__ == "__main__":
    main()
