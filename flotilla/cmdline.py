"""What `flotilla`, `flotilla operator` and `kubectl flotilla` share: an ArgumentParser whose
usage errors are one line, the argument types, and how a document or a table goes to stdout."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, NoReturn

#: Exit codes: done, failed, a usage error (argparse's own is 2 too).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr: the synopsis argparse prints first
    would push the reason off a small terminal, and `--help` is one flag away."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, not {value}")
    return value


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, not {text!r}")
    return int(text)


def seconds(text: str) -> float:
    """A duration that can bound a wait: finite and above zero (`0`, `nan` and `inf` would
    give up at once, never, or compare false with every clock reading)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, like 5 or 0.5, not {text!r}") \
            from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, not {text!r}")
    return value


def emit(doc: Any, output: str, *, sort_keys: bool = True) -> None:
    """A document as JSON or YAML on stdout (the formats of kubectl's and etcdctl's -o)."""
    if output == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    import yaml  # PyYAML: installed with the kubernetes client, a dependency of flotilla

    sys.stdout.write(yaml.safe_dump(doc, sort_keys=sort_keys, default_flow_style=False,
                                    allow_unicode=True))


def print_table(rows: list[dict[str, Any]]) -> None:
    """Rows under their keys' names, in columns as wide as their widest cell (kubectl's look)."""
    if not rows:
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(f"{c:<{widths[c]}}" for c in columns).rstrip())
    for row in rows:
        print("  ".join(f"{row[c]!s:<{widths[c]}}" for c in columns).rstrip())
