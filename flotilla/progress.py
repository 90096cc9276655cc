"""Progress bars for the command line's long waits: a restore, a learner's catch-up.

tqdm draws them on stderr (amounts, rate, time left) only where a person watches: on a
terminal. Elsewhere (a pipe, CI logs) they stay silent and the commands' own one-line
messages say what happens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

__all__ = ["Bar", "read_restore_progress"]


class Bar:
    """One bar at a time, replaced when the stage changes (fetching, then replaying)."""

    def __init__(self, file: IO[str] | None = None, disable: bool | None = None) -> None:
        self.file = file
        self.disable = disable  # None: only on a terminal
        self._bar: tqdm | None = None
        self._stage: str | None = None

    def show(self, stage: str, description: str, done: int, total: int, unit: str) -> None:
        if stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = tqdm(total=total, initial=done, desc=description, unit=unit,
                             file=self.file,
                             unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                             disable=self.disable, dynamic_ncols=True, leave=True)
        bar = self._bar
        assert bar is not None
        bar.total = max(total, done)
        if done != bar.n:
            bar.update(done - bar.n)
            bar.refresh()  # callers already pace their calls; tqdm's own pacing would drop them

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar = self._stage = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


def read_restore_progress(data_dir: str | Path) -> dict[str, Any] | None:
    """A restoring member's ``restore.progress`` (see ``flotilla.node.restore.ProgressFile``),
    or None when it has none (not restoring, or not started yet)."""
    try:
        doc = json.loads((Path(data_dir) / "restore.progress").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not {"stage", "done", "total", "unit"} <= doc.keys():
        return None
    return doc
