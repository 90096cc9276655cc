"""The `Counter` of docs/state-machines.md: the smallest useful state machine.

Run a cluster of it with ``--state-machine flotilla.examples.counter:Counter`` (``flotilla up
--state-machine ...`` for a local one), then add with ``POST /v1/command`` (body: an integer
in ASCII, such as ``5`` or ``-2``) and read with ``POST /v1/query`` (body: any JSON, such as
``null``).
"""

from __future__ import annotations

from typing import Any, BinaryIO


class Counter:
    """A total that commands add to. Deterministic: `apply` depends only on the total and the
    command; a command that is not an integer changes nothing and says so."""

    kind = "counter"

    def __init__(self) -> None:
        self.total = 0

    def apply(self, index: int, command: bytes) -> Any:
        try:
            self.total += int(command)
        except ValueError:
            return {"error": "not an integer"}
        return {"total": self.total}

    def write_snapshot(self, stream: BinaryIO) -> None:
        # Hexadecimal text: any size of integer, and no limit on converting it back
        # (Python limits decimal conversions of huge integers, not hexadecimal ones).
        stream.write(format(self.total, "x").encode())

    def restore(self, stream: BinaryIO) -> None:
        self.total = int(stream.read().decode() or "0", 16)

    def query(self, request: Any) -> Any:
        return self.total
