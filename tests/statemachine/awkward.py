"""A state machine for the API tests: its answers are not always JSON, and some queries make
it raise, so the member's handling of a user machine's results can be seen over HTTP."""

from __future__ import annotations

from typing import Any, BinaryIO


class Awkward:
    kind = "awkward"

    def __init__(self) -> None:
        self.count = 0

    def apply(self, index: int, command: bytes) -> Any:
        self.count += 1
        if command == b"bytes":
            return b"raw"  # not JSON
        return {"count": self.count}

    def write_snapshot(self, stream: BinaryIO) -> None:
        stream.write(str(self.count).encode())

    def restore(self, stream: BinaryIO) -> None:
        self.count = int(stream.read() or b"0")

    def query(self, request: Any) -> Any:
        if request == "set":
            return {1, 2}  # not JSON
        if request == "nan":
            return float("nan")  # not JSON either
        if request == "crash":
            raise RuntimeError("the machine broke")
        if not isinstance(request, str | None):
            raise TypeError(f"ask with a string, not {type(request).__name__}")
        return self.count


class Broken:
    """Fails while it is made: a spec naming it cannot load."""

    kind = "broken"

    def __init__(self) -> None:
        raise RuntimeError("no config\nsecond line")
