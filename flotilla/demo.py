"""The README's main job: a local three-member cluster that survives losing its leader.

Starts a local cluster (``flotilla.local``, what ``flotilla up`` runs), writes through every
member with the Python client (``flotilla.client``), kills the leader with SIGKILL, keeps
writing while the others elect a new one (and says how long writes were unavailable),
restarts the killed member and shows that it caught up; scales to five members and back to
three (``flotilla scale``, the operator's planner) with the leader among those leaving; then
snapshots to the archive, stops
the cluster, deletes every data dir and restores a new cluster from the archive. With
``--tls`` both clusters run with TLS on both ports (``flotilla up --tls``).
Usage: python -m flotilla.demo [--dir DIR] [--base-port PORT] [--tls]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

from flotilla import local, scaling


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


def _fresh(root: Path) -> None:
    """Stop whatever an earlier, interrupted demo left running in ``root``, then empty it."""
    if local.LocalCluster.exists(root):
        with contextlib.suppress(local.LocalClusterError):
            local.LocalCluster.load(root).stop(timeout=5)
    shutil.rmtree(root, ignore_errors=True)


def _wait_caught_up(cluster: local.LocalCluster, name: str, target: int,
                    timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = cluster.member_status(name)
        if doc and doc["applied_index"] >= target:
            return doc["applied_index"]
        time.sleep(0.05)
    raise SystemExit(f"{name} did not catch up; see {cluster.member(name).log_file}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".flotilla/demo", help="where the cluster lives")
    parser.add_argument("--base-port", type=int, default=None,
                        help="fixed ports (peers at BASE+i, clients at BASE+10+i); "
                             "default: free ports")
    parser.add_argument("--tls", action="store_true",
                        help="TLS on both ports, from a CA made under DIR/tls (flotilla up "
                             "--tls)")
    args = parser.parse_args(argv)
    root = Path(args.dir).resolve()
    _fresh(root)

    say(f"starting 3 members (data under {root}{', with TLS' if args.tls else ''})")
    try:
        cluster, leader = local.up(root, 3, base_port=args.base_port, say=say, tls=args.tls)
    except local.LocalClusterError as exc:
        raise SystemExit(f"the cluster did not start: {exc}") from None
    try:
        for m in cluster.members:
            say(f"  {m.name}: {m.client_url} (pid {m.pid}, log {m.log_file})")
        say(f"{leader} is the leader")
        if cluster.ca_file:
            say(f"TLS on both ports: members verify each other's certificates, clients "
                f"verify theirs with {cluster.ca_file}")

        say("writing 100 keys through every member (followers forward to the leader)")
        through = {m.name: cluster.client(m.client_url, prefer_leader=False)
                   for m in cluster.members}
        for i in range(100):
            through[cluster.names[i % 3]].put(f"key{i:03d}", f"value{i}".encode())
        read = through["n2"].get("key042")
        say(f"linearizable read of key042 from n2: {read.value.decode()} "
            f"(written at index {read.mod_index})")
        for c in through.values():
            c.close()

        client = cluster.client(timeout=15)
        say(f"kill -9 the leader ({leader}) and keep writing")
        cluster.kill(leader)
        killed_at = time.monotonic()
        client.put("after000", b"still here")  # retried, exactly once, until a leader takes it
        new_leader = client.status()["name"]
        say(f"writes resumed {time.monotonic() - killed_at:.2f} s after the kill; "
            f"new leader {new_leader}")
        for i in range(1, 50):
            client.put(f"after{i:03d}", b"still here")
        say("50 more writes acknowledged by the surviving majority")

        say(f"restarting {leader} on its old data; it catches up from the new leader")
        cluster.restart(leader)
        applied = _wait_caught_up(cluster, leader, client.status()["commit_index"])
        with cluster.client(cluster.url(leader), prefer_leader=False) as own:
            value = own.get("after049", consistency="serializable").value
        say(f"{leader} applied up to {applied} and serves after049 locally: "
            f"{value.decode() if value else value}")
        keys = client.list("key").keys
        say(f"keys under 'key': {len(keys)} of 100")

        say("scaling to 5 (flotilla scale 5): new members join as learners, catch up, then "
            "become voters in one joint-consensus change")
        scaling.scale(root, 5, say=lambda text: say(f"  {text}"))
        say("moving leadership to n5, then scaling back to 3 (flotilla scale 3): the leader "
            "is among the members that leave")
        client.transfer_leader("n5")
        scaling.scale(root, 3, say=lambda text: say(f"  {text}"))
        cluster = local.LocalCluster.load(root)
        voters = client.status()["config"]["voters"]
        say(f"voters now: {', '.join(voters)}; {len(client.list('key').keys)} of 100 keys")

        snap = client.snapshot()
        say(f"snapshot at index {snap['index']} shipped to the archive: {snap['location']}")
        archived = client.status()["archive"]["last_archived_index"]
        say(f"the archive holds every committed entry up to index {archived}")
        client.close()
    finally:
        say("stopping the cluster (flotilla down)")
        for name, what in cluster.stop(timeout=10).items():
            say(f"  {name}: {what}")

    say("disaster: every member's data dir is deleted; only the archive is left")
    for m in cluster.members:
        shutil.rmtree(m.data_dir)
    archive = cluster.state.archive
    restored_root = root / "restored"
    say(f"restoring a new cluster from {archive} (flotilla up --restore-from)")
    try:
        restored, leader = local.up(restored_root, 3, base_port=None, say=say,
                                    restore_from=archive, archive=(root / "archive2").as_uri(),
                                    tls=args.tls)
    except local.LocalClusterError as exc:
        raise SystemExit(f"the restored cluster did not start: {exc}") from None
    try:
        with restored.client(timeout=15) as client:
            keys = client.list("key").keys
            after = client.get("after049").value
            doc = client.status()
            say(f"restored cluster {doc['cluster_id']} (leader {leader}) starts at index "
                f"{doc['first_index'] - 1}: {len(keys)} of 100 keys, after049 = "
                f"{after.decode() if after else after}")
            client.put("restored", b"yes")
            say("and takes new writes")
    finally:
        say("stopping the restored cluster")
        restored.stop(timeout=10)
    say("done: the cluster carried on without its leader, healed, and came back from its "
        "archive")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
