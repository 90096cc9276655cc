"""Profile Flotilla's leader and one follower under compare_etcd.py's write load, with py-spy.

A fresh three-member cluster per concurrency level (plain HTTP, fsync on, the bench's timing),
K closed-loop clients writing 128-byte values to the leader; after the warm-up, ``py-spy
record`` samples the leader and one follower at the same time for ``--seconds``. Written to
``--out`` (outside the repository, e.g. /work/profiles), per level and member:

* ``{loop}-{K}c-{role}.txt``: py-spy's raw (collapsed stack) samples, one line per stack; it
  opens as is in https://www.speedscope.app or flamegraph.pl;
* ``{loop}-{K}c-{role}-top.txt``: the frames with the most own and cumulative samples, as
  ``py-spy top`` would show them summed over the window, and the buckets below;
* ``{loop}-{K}c.json``: the writes acknowledged while sampling and each member's CPU seconds
  (from /proc) in the same window, so that samples convert to microseconds per write.

Requires py-spy (``.venv/bin/pip install -e '.[bench]'``) and the right to ptrace the members
(root, or ``kernel.yama.ptrace_scope=0``).

Usage::

    .venv/bin/python bench/profile_node.py --clients 1,64 --seconds 10 --out /work/profiles
    .venv/bin/python bench/profile_node.py --event-loop uvloop --clients 64 --out /work/profiles
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import compare_etcd as bench  # bench/ is this script's directory, hence on sys.path

# Where a sample's time goes, by the frames on its stack: (bucket, pattern on "function
# (file)"). A sample counts in a bucket's cumulative share when any frame matches; its own
# (exclusive) share goes to the first bucket, in this order, that matches the innermost frame
# that matches any bucket.
BUCKETS = [
    ("fsync hand-off (to_thread, executor)",
     r"\((asyncio/threads\.py|concurrent/futures/thread\.py)|run_in_executor"),
    ("storage (node/storage)", r"\(node/storage/|\(flotilla/node/storage/"),
    ("msgpack (wire encode/decode)", r"msgpack|\((flotilla/)?node/wire\.py"),
    ("consensus core (node/consensus)", r"\((flotilla/)?node/consensus/"),
    ("state machine apply (node/statemachine)", r"\((flotilla/)?node/statemachine/"),
    ("transport (node/transport.py, websockets)",
     r"\((flotilla/)?node/transport\.py|aiohttp/(client_ws|_websocket|http_websocket)"),
    ("HTTP parsing (aiohttp parser, streams)",
     r"aiohttp/(http_parser|_http_parser|streams)\.py|data_received \(aiohttp/web_protocol"),
    ("client API handlers (node/http_api.py)", r"\((flotilla/)?node/http_api\.py"),
    ("runtime loop (node/runtime.py, executor.py, diskthread.py)",
     r"\((flotilla/)?node/(runtime|executor|diskthread)\.py"),
    ("metrics (node/metrics.py)", r"\((flotilla/)?node/metrics\.py"),
    ("aiohttp request handling (web_*, helpers, http_writer)",
     r"aiohttp/(web_\w+|helpers|http_writer|abc|payload)\.py|multidict|yarl"),
    ("asyncio scheduling (events, tasks, futures, selectors)",
     r"asyncio/(base_events|events|tasks|futures|selector_events|locks|timeouts|queues)\.py"
     r"|selectors\.py|uvloop"),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in BUCKETS]


def parse_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy raw output: (frames root first, count) per line."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.append((stack.split(";"), int(count)))
    return out


# Leaf frames where a sampled thread waits rather than computes: py-spy counts a thread as
# active while it is runnable or in uninterruptible sleep, so on a busy host (and during fsync)
# these show up as "own" time. They are listed, but left out of the CPU-normalised figures.
WAITS = re.compile(r"^(EpollSelector\.select \(selectors\.py|_worker \(concurrent/futures/"
                   r"thread\.py|DiskStorage\.sync \(node/storage/wal\.py|Event\.wait|"
                   r"Condition\.wait|DiskThread\._work \(node/diskthread\.py)")


def summarize(samples: list[tuple[list[str], int]], writes: int, cpu_us_per_write: float | None,
              top: int = 25) -> str:
    """Own and cumulative samples per frame and per bucket. us/write: a frame's share of the
    working samples (waits left out) times the process's CPU per write from /proc."""
    total = sum(c for _, c in samples)
    own: collections.Counter[str] = collections.Counter()
    cum: collections.Counter[str] = collections.Counter()
    b_own: collections.Counter[str] = collections.Counter()
    b_cum: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    waits = 0
    for frames, count in samples:
        py = [f for f in frames if not f.startswith(("thread ", "process "))]
        threads[frames[0] if frames and frames[0].startswith("thread ") else "?"] += count
        if py and WAITS.match(py[-1]):
            waits += count
            own[py[-1]] += count
            continue
        if py:
            own[py[-1]] += count
        for f in set(py):
            cum[f] += count
        hit = set()
        leaf_bucket = None
        for f in reversed(py):
            for name, rx in COMPILED:
                if rx.search(f):
                    hit.add(name)
                    if leaf_bucket is None:
                        leaf_bucket = name
        for name in hit:
            b_cum[name] += count
        b_own[leaf_bucket or "other (interpreter, stdlib, unmatched)"] += count
    working = total - waits

    def us(n: int) -> str:
        return f"{n / working * cpu_us_per_write:7.1f}" if working and cpu_us_per_write \
            else "    n/a"

    def pct(n: int) -> str:
        return f"{n / working:6.1%}" if working else "   n/a"

    lines = [f"samples: {total} ({waits} of them waits: epoll, the executor's idle queue, "
             f"fsync in the kernel; {working} working); writes acknowledged while sampling: "
             f"{writes}; process CPU per write from /proc: "
             + (f"{cpu_us_per_write:.0f} us" if cpu_us_per_write else "n/a"),
             "% and us/write below are of the working samples (waits excluded), scaled to the "
             "process's /proc CPU per write",
             "", "threads: " + ", ".join(f"{t} {c}" for t, c in threads.most_common()), "",
             f"top {top} frames by own samples (waits marked *, their % of all samples):",
             "    own%  us/write   cum%  frame"]
    for frame, n in own.most_common(top):
        if WAITS.match(frame):
            lines.append(f"  *{n / total:5.1%}        -        -  {frame}")
        else:
            lines.append(f"  {pct(n)}  {us(n)}  {pct(cum[frame])}  {frame}")
    lines += ["", f"top {top} frames by cumulative samples:", "    cum%  us/write  frame"]
    for frame, n in cum.most_common(top):
        lines.append(f"  {pct(n)}  {us(n)}  {frame}")
    lines += ["", "buckets (own: by the innermost matching frame; cumulative: any frame):",
              "    own%  us/write    cum%  us/write  bucket"]
    for name in [n for n, _ in BUCKETS] + ["other (interpreter, stdlib, unmatched)"]:
        lines.append(f"  {pct(b_own[name])}  {us(b_own[name])}  "
                     f"{pct(b_cum[name])}  {us(b_cum[name])}  {name}")
    return "\n".join(lines) + "\n"


def proc_times(pid: int | None) -> tuple[float, float] | None:
    """(user, system) CPU seconds of ``pid`` so far, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick
    except (OSError, ValueError, IndexError):
        return None


async def profile_level(k: int, args: argparse.Namespace, value: bytes, root: Path) -> None:
    workdir = root / f"{k}c"
    workdir.mkdir()
    system = await asyncio.to_thread(bench.FlotillaCluster, workdir,
                                     event_loop=args.event_loop)
    try:
        async with bench.new_session(system) as session:
            leader = await bench.agreed_leader(system, session, 30)
            follower = next(n for n in system.names() if n != leader)
            url = system.client_url(leader)
            result = bench.LoadResult(k, args.seconds)
            load = asyncio.create_task(bench.drive(
                system, session, [url], k, duration=args.seconds + 2, warmup=args.warmup,
                value=value, timeout=10.0, result=result))
            await asyncio.sleep(args.warmup)
            stem = f"{args.event_loop}{'-' + args.tag if args.tag else ''}-{k}c"
            members = {"leader": leader, "follower": follower}
            cpu0 = {role: proc_times(system.pid(name)) for role, name in members.items()}
            n0 = len(result.successes)
            spies = {role: await asyncio.create_subprocess_exec(
                args.py_spy, "record", "--pid", str(system.pid(name)), "--duration",
                str(args.seconds), "--rate", str(args.rate), "--format", "raw", "--function",
                "--threads", *args.spy_args, "--output", str(args.out / f"{stem}-{role}.txt"),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for role, name in members.items()}
            errors = {role: (await spy.communicate())[1] for role, spy in spies.items()}
            writes = len(result.successes) - n0
            cpu1 = {role: proc_times(system.pid(name)) for role, name in members.items()}
            await load
    finally:
        await asyncio.to_thread(system.close)
    window = {role: {"user": cpu1[role][0] - cpu0[role][0],
                     "system": cpu1[role][1] - cpu0[role][1]}
              if cpu0[role] and cpu1[role] else None for role in members}
    meta = {"clients": k, "event_loop": args.event_loop, "seconds": args.seconds,
            "rate_hz": args.rate, "writes_while_sampling": writes,
            "writes_per_second": writes / args.seconds, "members": members,
            "cpu_seconds_in_window": window, "load_average": os.getloadavg()}
    (args.out / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    print(f"{k} clients: {writes / args.seconds:.0f} writes/s while sampling; CPU s in the "
          f"window {window}", flush=True)
    for role in members:
        raw = args.out / f"{stem}-{role}.txt"
        if not raw.exists():
            print(f"  py-spy on the {role} wrote nothing: {errors[role].decode()[-500:]}",
                  flush=True)
            continue
        cpu = window[role]
        per_write = (cpu["user"] + cpu["system"]) / writes * 1e6 if cpu and writes else None
        summary = summarize(parse_raw(raw), writes, per_write)
        (args.out / f"{stem}-{role}-top.txt").write_text(
            f"# {role} {members[role]}, {k} clients, event loop {args.event_loop}, "
            f"{writes / args.seconds:.0f} writes/s, CPU in the window {cpu}, load average "
            f"{meta['load_average'][0]:.2f}\n" + summary)
        print(f"  {role}: {raw} and {stem}-{role}-top.txt", flush=True)


async def main_async(args: argparse.Namespace) -> int:
    value = os.urandom(64).hex().encode()  # 128 bytes, as compare_etcd.py writes
    root = Path(tempfile.mkdtemp(prefix="flotilla-profile-"))
    try:
        for k in args.levels:
            await profile_level(k, args, value, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,64", help="concurrency levels (1,64)")
    p.add_argument("--seconds", type=int, default=10, help="sampling seconds (10)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before sampling (3)")
    p.add_argument("--rate", type=int, default=100, help="samples per second (100)")
    p.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="uvloop",
                   help="the members' FLOTILLA_EVENT_LOOP (uvloop, their default)")
    p.add_argument("--out", type=Path, required=True, help="where the profiles go")
    p.add_argument("--tag", default="", help="added to the file names (e.g. gil)")
    p.add_argument("--spy-args", default="--nonblocking",
                   help="more py-spy record options, space-separated (default --nonblocking: "
                        "a paused member's threads all look busy to py-spy, which then counts "
                        "waits in epoll and in the executor's queue as work; --gil: only "
                        "samples holding the GIL)")
    p.add_argument("--py-spy", default=shutil.which("py-spy")
                   or str(Path(sys.executable).parent / "py-spy"), help="the py-spy binary")
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.clients.split(",") if x.strip()]
    args.spy_args = args.spy_args.split()
    args.out.mkdir(parents=True, exist_ok=True)
    if not Path(args.py_spy).exists():
        p.error(f"no py-spy at {args.py_spy}: .venv/bin/pip install -e '.[bench]'")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
