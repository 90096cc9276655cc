"""What answering one HTTP request costs a server process, aiohttp's web server against a bare
asyncio protocol: the ceiling of what a leaner client port could save the leader per write.

Both servers run on uvloop in a process of their own and answer `PUT /v1/kv/{key}` (a 128-byte
body) with a write's answer, `{"index": 1}` and its headers. The aiohttp one is set up as the
member's client port is (a dynamic route, one middleware, no access log); the bare one splits
the head, reads Content-Length and writes a prepared answer, with none of the checks a real
port needs (deadlines, limits, chunked bodies, Expect, errors). K keep-alive clients in this
process, on uvloop; the server's CPU (user + system, /proc) over the requests answered in the
measured window. Passes alternate the two servers; cells are medians.

    .venv/bin/python bench/http_overhead.py [--clients 64] [--seconds 5] [--passes 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

import aiohttp
import uvloop

SERVER = r'''
import asyncio, sys, uvloop
from aiohttp import web

mode, port = sys.argv[1], int(sys.argv[2])
ANSWER = b'{"index": 1}'


async def put(request):
    await request.read()
    return web.Response(text='{"index": 1}', content_type="application/json",
                        headers={"Flotilla-Index": "1", "Flotilla-Mod-Index": "1"})


@web.middleware
async def timed(request, handler):
    return await handler(request)


class Bare(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            total = end + 4 + length
            if len(self.buf) < total:
                return
            self.buf = self.buf[total:]
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                b"Flotilla-Index: 1\r\nFlotilla-Mod-Index: 1\r\nContent-Length: %d\r\n\r\n%s"
                % (len(ANSWER), ANSWER))


async def main():
    if mode == "aiohttp":
        app = web.Application(middlewares=[timed])
        app.router.add_route("PUT", r"/v1/kv/{key:[\s\S]+}", put)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    else:
        await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", port)
    print("ready", flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
'''


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load(port: int, pid: int, clients: int, seconds: float) -> tuple[float, float]:
    """(requests/s, server CPU us per request) over `seconds` after a 1 s warm-up."""
    value = b"x" * 128
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def client(i: int, until: float) -> None:
            nonlocal done
            n = 0
            while time.perf_counter() < until:
                url = f"http://127.0.0.1:{port}/v1/kv/bench/{i}/{n % 1000}"
                async with session.put(url, data=value) as r:
                    await r.read()
                n += 1
                done += 1

        await asyncio.gather(*(client(i, time.perf_counter() + 1) for i in range(clients)))
        done, cpu0 = 0, cpu_seconds(pid)
        until = time.perf_counter() + seconds
        await asyncio.gather(*(client(i, until) for i in range(clients)))
        used = cpu_seconds(pid) - cpu0
    return done / seconds, used / done * 1e6


def measure(mode: str, args: argparse.Namespace) -> tuple[float, float]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(port)],
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        return uvloop.run(load(port, server.pid, args.clients, args.seconds))
    finally:
        server.kill()
        server.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args()
    modes = ["aiohttp", "bare"]
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for n in range(args.passes):
        for mode in modes if n % 2 == 0 else modes[::-1]:
            rows[mode].append(measure(mode, args))
            rate, cpu = rows[mode][-1]
            print(f"pass {n + 1} {mode:>7}: {rate:8.0f} requests/s, server CPU {cpu:6.1f} "
                  "us/request", file=sys.stderr, flush=True)
    print(f"{args.clients} keep-alive clients, {args.seconds:g} s per run, medians of "
          f"{args.passes} passes")
    print(f"{'server':<10} {'requests/s':>12} {'server CPU us/request':>22}")
    for mode in modes:
        rate = statistics.median(r for r, _ in rows[mode])
        cpu = statistics.median(c for _, c in rows[mode])
        print(f"{mode:<10} {rate:>12.0f} {cpu:>22.1f}")
    ratio = statistics.median(a[1] / b[1] for a, b in zip(rows["aiohttp"], rows["bare"],
                                                          strict=True))
    print(f"aiohttp/bare server CPU per request: {ratio:.1f}x")


if __name__ == "__main__":
    main()
