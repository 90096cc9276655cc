"""The consensus core does no I/O: it imports only pure standard-library modules.

This is what lets the simulator drive it deterministically (STYLE.md habits 1, 3 and 9).
"""

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "node" / "consensus"
ALLOWED = {"__future__", "dataclasses", "enum", "typing", "collections", "json", "random",
           "bisect", "heapq", "itertools", "functools", "math"}
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


def modules():
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 5, f"expected the core's modules under {CORE}"
    return files


def test_core_imports_only_pure_standard_library_modules():
    for path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:
                    continue  # a sibling module of the core
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            for name in names:
                assert name in ALLOWED, f"{path.name}:{node.lineno} imports {name}"


def test_core_calls_no_io_and_no_global_randomness():
    for path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{path.name}:{node.lineno}"
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "random"):
                assert node.attr == "Random", (
                    f"{path.name}:{node.lineno} uses random.{node.attr}: randomness must come "
                    "from the seeded generator in Settings")


def test_importing_the_core_loads_no_io_library():
    forbidden = ["asyncio", "aiohttp", "boto3", "botocore", "kubernetes", "kopf", "pyspark",
                 "socket", "ssl", "msgpack", "threading", "subprocess"]
    code = ("import sys, flotilla.node.consensus as c; c.RaftCore; "
            f"print(','.join(m for m in {forbidden!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"the core pulled in: {out.stdout.strip()}"
