"""The disk thread: writes run in the order handed over, off the loop, and their results and
failures come back to the awaiting coroutine."""

import asyncio
import threading

import pytest
from flotilla.node.diskthread import DiskThread


def test_writes_run_in_order_off_the_loop_and_return_their_results():
    ran: list[tuple[int, str]] = []

    def write(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        return i * 10

    async def main() -> list[int]:
        disk = DiskThread("disk-test")
        try:
            return await asyncio.gather(*(disk.run(write, i) for i in range(50)))
        finally:
            disk.stop()

    assert asyncio.run(main()) == [i * 10 for i in range(50)]
    assert [i for i, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"disk-test"}


def test_a_failed_write_raises_in_the_waiter_and_the_next_write_still_runs():
    def fail() -> None:
        raise OSError(5, "Input/output error")

    async def main() -> int:
        disk = DiskThread()
        try:
            with pytest.raises(OSError, match="Input/output error"):
                await disk.run(fail)
            return await disk.run(lambda: 7)
        finally:
            disk.stop()

    assert asyncio.run(main()) == 7


def test_a_cancelled_waiter_does_not_break_the_thread():
    gate = threading.Event()

    async def main() -> str:
        disk = DiskThread()
        try:
            slow = asyncio.ensure_future(disk.run(gate.wait, 5))
            await asyncio.sleep(0.01)
            slow.cancel()
            gate.set()
            return await disk.run(lambda: "after")
        finally:
            disk.stop()

    assert asyncio.run(main()) == "after"
