"""The `flotilla` command: `flotilla node ...` runs a member (more subcommands as they land)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: flotilla COMMAND [ARGS]

commands:
  node      run one cluster member (flotilla node --help)
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "node":
        from flotilla.node.main import main as node_main

        return node_main(rest)
    print(f"flotilla: unknown command {command!r}\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
