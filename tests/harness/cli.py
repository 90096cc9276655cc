"""Running `flotilla` as a user does, for tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: Seconds that cleanup gives the members of a `flotilla up` cluster to exit on SIGTERM before
#: they are killed (`flotilla down --timeout`, `LocalCluster.stop(timeout=...)`). A leader
#: stopped together with every other member waits up to 5 s for a hand-over that cannot
#: happen (docs/node.md, signals); cleanup checks nothing about the shutdown, so it does not
#: wait for that. Tests of `down` and of a clean shutdown use the real timeouts.
CLEANUP_TIMEOUT_S = 1


def flotilla(*args: str, cwd: Path | None = None, stdin: bytes | None = None,
             timeout: float = 60, env: Mapping[str, str] | None = None, text: bool = False
             ) -> subprocess.CompletedProcess:
    """`flotilla ARGS` as a user runs it: a separate process with none of the caller's
    FLOTILLA_* variables, only those in ``env``; output as bytes, or str with ``text``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    return subprocess.run([sys.executable, "-m", "flotilla", *args], cwd=cwd, input=stdin,
                          capture_output=True, timeout=timeout, env={**clean, **(env or {})},
                          text=text)
