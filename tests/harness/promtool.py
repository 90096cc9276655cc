"""Prometheus's own checker, `promtool`, for what Flotilla exports and ships.

Debian and Ubuntu package it with Prometheus (`apt-get install prometheus`); `PROMTOOL` names
another binary. Tests that need it skip, saying how to get it, where it is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

__all__ = ["check_metrics", "promtool"]

HOW = ("promtool is not installed: apt-get install prometheus (Debian, Ubuntu), or set "
       "PROMTOOL to a promtool binary")


def promtool() -> str:
    """The promtool binary; skips the calling test when there is none."""
    found = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not found:
        pytest.skip(HOW)
    return found


def check_metrics(text: bytes | str, source: str) -> None:
    """`promtool check metrics` on an exposition (its lint included): fails the test with
    what promtool said."""
    data = text.encode() if isinstance(text, str) else text
    result = subprocess.run([promtool(), "check", "metrics"], input=data, capture_output=True,
                            timeout=30)
    said = (result.stdout + result.stderr).decode(errors="replace").strip()
    assert result.returncode == 0, f"promtool check metrics on {source}:\n{said}"
