"""How fast `flotilla operator` turns a RaftCluster into voters, against kmock's Kubernetes API
with real member processes (the stand-in StatefulSet controller and kubelet of the operator
tests, `tests/operator/kubelet.py`, TLS on both ports as by default). Prints a table.

    .venv/bin/python bench/operator_react.py [--runs 5] [--interval SECONDS]

Two timings per run, each from the API write to the status that shows it done:

- create -> Ready: the RaftCluster is created (what `kubectl apply` does) until its status
  says phase Ready with 3 voters;
- scale 3 -> 5: spec.replicas is patched to 5 (what `kubectl scale` does through the scale
  subresource) until status.configuration holds 5 voters and is not joint.

Each run starts a fresh kmock, kubelet and operator (the operator gets a few seconds to start
watching before the clock starts). `--interval` is passed to the operator as is; without it the
operator runs with its own default. The members use the tests' fast timing (election timeout
500 ms, heartbeat 50 ms). Each row is the median of the runs, with the fastest and slowest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NS, NAME = "default", "bench"
WARM_UP_S = 4.0  # for the operator to log in and start its watches
TIMEOUT_S = 120.0


def raft_cluster() -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
        "metadata": {"name": NAME, "namespace": NS, "generation": 1},
        "spec": {"replicas": 3, "timing": {"electionTimeoutMs": 500, "heartbeatMs": 50}},
    }


def wait(api: Any, done: Callable[[dict[str, Any]], bool], what: str) -> float:
    """When the RaftCluster's status first satisfies `done` (polled every 20 ms)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        obj = api.get("RaftCluster", NS, NAME) or {}
        if done(obj.get("status") or {}):
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {TIMEOUT_S:g}s waiting for {what}")


def one_run(interval: str | None) -> tuple[float, float]:
    from tests.operator.kubelet import Kmock, Kubelet, start_operator, stop_operator

    root = Path(tempfile.mkdtemp(prefix="operator-react-"))
    server = Kmock().start()
    api = server.api()
    kubelet = Kubelet(api, NS, root).start()
    flags = ["--interval", interval] if interval else []
    with open(root / "operator.log", "wb") as log:
        operator = start_operator(server, kubelet, root, log, *flags)
    try:
        time.sleep(WARM_UP_S)
        began = time.monotonic()
        api.create(raft_cluster())
        ready = wait(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") == 3,
                     "phase Ready with 3 voters") - began
        began = time.monotonic()
        api.patch("RaftCluster", NS, NAME, {"spec": {"replicas": 5}})
        scaled = wait(api, lambda s: len((s.get("configuration") or {}).get("voters") or [])
                      == 5 and not (s.get("configuration") or {}).get("joint"),
                      "5 voters, not joint") - began
        return ready, scaled
    finally:
        stop_operator(operator)
        kubelet.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--interval", default=None,
                        help="the operator's --interval (default: the operator's own)")
    args = parser.parse_args()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    rows: list[tuple[float, float]] = []
    for i in range(args.runs):
        rows.append(one_run(args.interval))
        print(f"run {i + 1}: create -> Ready {rows[-1][0]:.2f} s, scale 3 -> 5 "
              f"{rows[-1][1]:.2f} s", file=sys.stderr, flush=True)
    print(f"operator --interval {args.interval or '(default)'}, {args.runs} runs")
    print(f"{'timing':<36} {'median':>8} {'min':>8} {'max':>8}")
    for label, values in (("create -> Ready (3 voters)", [r[0] for r in rows]),
                          ("scale 3 -> 5 -> all five voting", [r[1] for r in rows])):
        print(f"{label:<36} {statistics.median(values):>7.2f}s {min(values):>7.2f}s "
              f"{max(values):>7.2f}s")


if __name__ == "__main__":
    main()
