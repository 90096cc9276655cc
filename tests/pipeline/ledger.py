"""A user's state machine for the pipeline's tests: a ledger whose commands depend on the whole
state (a transfer reads two balances, an interest command touches every account), so no fold
by key can compute it, only a replay in order."""

from __future__ import annotations

import json
from typing import Any, BinaryIO


class Ledger:
    kind = "ledger"

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}
        self.applied = 0

    def apply(self, index: int, command: bytes) -> Any:
        self.applied = index
        try:
            op, *args = command.decode().split()
            if op == "deposit":
                self.balances[args[0]] = self.balances.get(args[0], 0) + int(args[1])
            elif op == "transfer":
                source, dest, amount = args[0], args[1], int(args[2])
                if self.balances.get(source, 0) < amount:
                    return {"error": "insufficient funds"}
                self.balances[source] -= amount
                self.balances[dest] = self.balances.get(dest, 0) + amount
            elif op == "interest":  # every account, in sorted order
                for name in sorted(self.balances):
                    self.balances[name] += self.balances[name] * int(args[0]) // 100
            else:
                return {"error": f"unknown command {op}"}
        except (ValueError, IndexError, UnicodeDecodeError):
            return {"error": "bad command"}
        return {"ok": index}

    def write_snapshot(self, stream: BinaryIO) -> None:
        stream.write(json.dumps({"applied": self.applied, "balances": self.balances},
                                sort_keys=True).encode())

    def restore(self, stream: BinaryIO) -> None:
        doc = json.loads(stream.read())
        self.applied, self.balances = doc["applied"], doc["balances"]

    def query(self, request: Any) -> Any:
        return self.balances.get(request)
