"""Port allocation: distinct, bindable, and never shared between concurrent processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ports
from tests.harness.ports import PortAllocator, bindable, loopback_hosts


def test_allocated_ports_are_distinct_bindable_and_outside_the_ephemeral_range(
        tmp_path: Path) -> None:
    allocator = PortAllocator(tmp_path)
    taken = allocator.allocate_many(40)
    assert len(set(taken)) == 40
    low, high = ports._ephemeral_range()
    assert all(not low <= p <= high for p in taken)
    assert all(bindable("127.0.0.1", p) for p in taken)
    allocator.release_all()


@pytest.fixture
def quiet_ports() -> Iterator[list[int]]:
    """20 consecutive ports nobody else uses meanwhile (reserved through the shared
    allocator), for allocators confined to a tiny range in a private lock directory."""
    block = ports.allocate_range(20)
    yield block
    for port in block:
        ports.release_port(port)


def test_a_port_held_by_one_allocator_is_never_handed_out_by_another(
        tmp_path: Path, quiet_ports: list[int]) -> None:
    # Two allocators on the same lock directory behave like two processes: flock locks belong
    # to open file descriptions, not to the process.
    first = PortAllocator(tmp_path, port_range=(quiet_ports[0], quiet_ports[1]))
    second = PortAllocator(tmp_path, port_range=(quiet_ports[0], quiet_ports[1]))
    a, b = first.allocate_many(2)
    with pytest.raises(RuntimeError, match="no 1 free port"):
        second.allocate()
    first.release(b)
    assert second.allocate() == b
    assert first.held == {a} and second.held == {b}


def test_a_port_something_listens_on_is_skipped(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        allocator = PortAllocator(tmp_path, port_range=(port, port + 1))
        if not bindable("127.0.0.1", port + 1):
            pytest.skip(f"port {port + 1} happens to be in use")
        assert allocator.allocate() == port + 1


def test_consecutive_ports_for_a_base_port(tmp_path: Path) -> None:
    allocator = PortAllocator(tmp_path)
    block = allocator.allocate_range(13)
    assert block == list(range(block[0], block[0] + 13))
    assert allocator.allocate() not in block


def test_concurrent_processes_never_get_the_same_port(tmp_path: Path) -> None:
    # 4 x 40 ports out of 200: without the locks, random starts would collide.
    low = ports.allocate_range(200)
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.harness.ports import PortAllocator
        got = PortAllocator({str(tmp_path)!r}, port_range=({low[0]}, {low[-1]})).allocate_many(40)
        print(json.dumps(got), flush=True)
        sys.stdin.read()  # hold the locks until the test has heard from everyone
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        lists = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.communicate("", timeout=30)
        for port in low:
            ports.release_port(port)
    everything = [port for got in lists for port in got]
    assert len(everything) == 160 and len(set(everything)) == 160


def test_loopback_hosts_are_distinct_and_bindable_or_all_the_same_fallback() -> None:
    hosts = loopback_hosts(3)
    if ports.loopback_aliases_supported():
        assert hosts == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        assert all(bindable(h, 0) for h in hosts)
    else:
        assert hosts == ["127.0.0.1"] * 3


def test_loopback_hosts_fall_back_to_127_0_0_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "loopback_aliases_supported", lambda: False)
    assert loopback_hosts(2) == ["127.0.0.1", "127.0.0.1"]
    with pytest.raises(ValueError):
        loopback_hosts(300)


def test_module_functions_share_one_allocator() -> None:
    port = ports.allocate_port()
    assert port in ports.default_allocator().held
    ports.release_port(port)
    assert port not in ports.default_allocator().held
