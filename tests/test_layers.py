"""The layers of the member, enforced (STYLE.md habits 9 and 14).

- The HTTP layer, the archiver, the operator, the pipeline and the CLI use the consensus core's
  public data types, errors and membership rules, never its internals (the core object, its
  log, progress or quorum arithmetic), and never the runtime or the executor that own it: they
  talk to `node.Node`.
- The HTTP layer and the archiver do not reach into the member's parts through attributes
  (`.core`, `.runtime`, `.storage`, `._snapshot`...): the facade offers what they need.
- The member's modules import each other without cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "node"

# What outsiders may take from flotilla.node.consensus: data types, errors, rules.
CONSENSUS_PUBLIC = {
    "CoreStatus", "EMPTY_MEMBERSHIP", "Entry", "EntryKind", "HardState", "InvalidMembership",
    "Membership", "MembershipChangeInProgress", "Message", "MessageType", "NotLeader",
    "PeerProgress", "ProposalError", "ReadState", "RecoveredState", "Role", "Snapshot",
    "SnapshotMeta", "SoftState", "TransferInProgress",
}
CONSENSUS_MODULES_ALLOWED = {"flotilla.node.consensus", "flotilla.node.consensus.types",
                             "flotilla.node.consensus.membership"}
INTERNAL_NODE_MODULES = {"runtime", "executor", "bootstrap", "snapshotting"}
OUTSIDERS = [NODE / "http_api.py", NODE / "client_lane.py", NODE / "machine_api.py",
             NODE / "archiver.py",
             *sorted((ROOT / "operator").glob("*.py")), *sorted((ROOT / "pipeline").glob("*.py")),
             *sorted((ROOT / "flotilla").glob("*.py"))]
FACADE_USERS = [NODE / "http_api.py", NODE / "client_lane.py", NODE / "machine_api.py",
                NODE / "archiver.py"]
PARTS = {"core", "runtime", "storage", "executor", "snapshots", "_snapshot", "progress"}


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "flotilla." + ".".join(parts) if parts[0] != "flotilla" else ".".join(parts)


def _imports(path: Path, *, runtime_only: bool = True) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of each import; those under `if TYPE_CHECKING:` are left
    out when `runtime_only` (they never run)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                    and node.test.id == "TYPE_CHECKING"):
                skipped.update(id(n) for n in ast.walk(node))
    package = _module_of(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else _module_of(path)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module, [a.name for a in node.names]))
    return found


@pytest.mark.parametrize("path", OUTSIDERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_outsiders_use_only_the_cores_public_types_and_rules(path: Path) -> None:
    for line, module, names in _imports(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        if module.startswith("flotilla.node.consensus"):
            assert module in CONSENSUS_MODULES_ALLOWED, f"{where} imports {module}"
            for name in names:
                if module == "flotilla.node.consensus.membership":
                    continue
                assert name in CONSENSUS_PUBLIC, f"{where} imports {name} from {module}"
        for internal in INTERNAL_NODE_MODULES:
            assert module != f"flotilla.node.{internal}", (
                f"{where} imports flotilla.node.{internal}: talk to node.Node instead")
            assert not (module == "flotilla.node" and internal in names), where


@pytest.mark.parametrize("path", FACADE_USERS, ids=lambda p: p.name)
def test_the_http_layer_and_the_archiver_reach_into_no_part_of_the_member(path: Path) -> None:
    def is_the_member(expr: ast.expr) -> bool:  # `node` or `self.node`
        return ((isinstance(expr, ast.Name) and expr.id == "node")
                or (isinstance(expr, ast.Attribute) and expr.attr == "node"))

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and is_the_member(node.value)
                and (node.attr in PARTS or node.attr.startswith("_"))):
            pytest.fail(f"{path.name}:{node.lineno} reads node.{node.attr}: ask node.Node")


def test_the_members_modules_import_each_other_without_cycles() -> None:
    modules = {_module_of(p): p for p in NODE.rglob("*.py")}
    graph = {name: {m for _, m, _ in _imports(path) if m in modules and m != name}
             for name, path in modules.items()}
    # `from . import x` names a module through the package: count it as an edge to x.
    for name, path in modules.items():
        for _, module, names in _imports(path):
            graph[name] |= {f"{module}.{n}" for n in names if f"{module}.{n}" in modules}
        graph[name].discard(name)
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = [*trail[trail.index(name):], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for other in sorted(graph[name]):
            # A package's __init__ re-exporting its modules is not a cycle of theirs.
            if not other.startswith(name + ".") and not name.startswith(other + "."):
                visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
