"""Waiting for a condition in process-level tests, with the last answer in the failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.harness.kvclient import TRANSPORT_ERRORS

__all__ = ["wait_for"]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something true; transport errors count as false."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            value = predicate()
            last = f"last answer: {value!r}"
        except (*TRANSPORT_ERRORS, RuntimeError, ValueError, KeyError) as exc:
            value, last = None, f"last error: {type(exc).__name__}: {exc}"
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} ({last})")
        time.sleep(interval)
