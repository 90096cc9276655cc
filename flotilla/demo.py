"""The README's main job: a local three-member cluster that survives losing its leader.

Starts three `flotilla node` processes on loopback, writes and reads through different members,
kills the leader with SIGKILL, keeps writing while the others elect a new one (and says how
long writes were unavailable), restarts the killed member and shows that it caught up.
Usage: python -m flotilla.demo [--dir DIR] [--base-port 27000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

NAMES = ("n1", "n2", "n3")


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


def request(method: str, url: str, body: bytes | None = None, timeout: float = 2.0):
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Cluster:
    def __init__(self, root: Path, base_port: int) -> None:
        self.root = root
        self.peer = {n: f"127.0.0.1:{base_port + i}" for i, n in enumerate(NAMES)}
        self.client = {n: f"127.0.0.1:{base_port + 10 + i}" for i, n in enumerate(NAMES)}
        self.procs: dict[str, subprocess.Popen] = {}

    def url(self, name: str) -> str:
        return f"http://{self.client[name]}"

    def start(self, name: str) -> None:
        initial = ",".join(f"{n}=http://{self.peer[n]}" for n in NAMES)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "flotilla.node", "--name", name,
             "--data-dir", str(self.root / name), "--listen-peer", self.peer[name],
             "--listen-client", self.client[name], "--initial-cluster", initial,
             "--cluster-id", "demo"],
            stdout=log, stderr=log)

    def status(self, name: str) -> dict | None:
        try:
            code, body = request("GET", self.url(name) + "/v1/status", timeout=1)
        except OSError:
            return None
        return json.loads(body) if code == 200 else None

    def leader(self, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.procs:
                st = self.status(name)
                if st and st["role"] == "leader":
                    return name
            time.sleep(0.05)
        raise SystemExit("no leader was elected; see the member logs in " + str(self.root))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".flotilla/demo", help="where member data dirs go")
    parser.add_argument("--base-port", type=int, default=27000)
    args = parser.parse_args(argv)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    cluster = Cluster(root, args.base_port)
    try:
        say(f"starting 3 members (data under {root})")
        for name in NAMES:
            cluster.start(name)
        leader = cluster.leader()
        say(f"{leader} is the leader")

        say("writing 100 keys through every member (followers forward to the leader)")
        for i in range(100):
            name = NAMES[i % 3]
            code, body = request("PUT", f"{cluster.url(name)}/v1/kv/key{i:03d}",
                                 f"value{i}".encode())
            assert code == 200, (code, body)
        code, body = request("GET", f"{cluster.url(NAMES[1])}/v1/kv/key042")
        say(f"linearizable read of key042 from n2: {body.decode()}")

        say(f"kill -9 the leader ({leader}) and keep writing")
        cluster.procs[leader].kill()
        cluster.procs[leader].wait()
        others = [n for n in NAMES if n != leader]
        killed_at = time.monotonic()
        written = 0
        while written < 50:
            for name in others:
                try:
                    code, _ = request("PUT", f"{cluster.url(name)}/v1/kv/after{written:03d}",
                                      b"still here")
                except OSError:
                    code = 0
                if code == 200:
                    if written == 0:
                        say(f"writes resumed {time.monotonic() - killed_at:.2f} s after the "
                            f"kill; new leader {cluster.leader()}")
                    written += 1
                    break
            else:
                time.sleep(0.02)
        say("50 more writes acknowledged by the surviving majority")

        say(f"restarting {leader} on its old data; it catches up from the new leader")
        cluster.start(leader)
        target = cluster.status(cluster.leader())["commit_index"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = cluster.status(leader)
            if st and st["applied_index"] >= target:
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"{leader} did not catch up; see {root}/{leader}.log")
        code, body = request("GET", f"{cluster.url(leader)}/v1/kv/after049"
                             "?consistency=serializable")
        say(f"{leader} applied up to {st['applied_index']} and serves after049 locally: "
            f"{body.decode()}")
        code, body = request("GET", f"{cluster.url(leader)}/v1/kv?prefix=key")
        say(f"keys under 'key': {len(json.loads(body)['keys'])} of 100")
        say("done: the cluster carried on without its leader and healed")
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
