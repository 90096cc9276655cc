"""The repository's top-level folders must not shadow the standard library when Python runs
from the repository root (which puts the checkout first on sys.path): `operator/` is installed
as `flotilla.operator`, and `import operator` there must still be the standard library's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_import_operator_from_the_repo_root_is_the_standard_library():
    # -S: no site, so nothing has imported `operator` before the checkout is searched.
    done = run("-S", "-c", "import operator, collections; from operator import eq, itemgetter;"
               " print(operator.__file__); assert itemgetter(1)('ab') == 'b'")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent != ROOT / "operator"


def test_a_venv_can_be_made_from_the_repo_root(tmp_path):
    done = run("-m", "venv", "--without-pip", str(tmp_path / "venv"))
    assert done.returncode == 0, done.stderr


def test_the_operator_package_is_flotilla_operator():
    done = run("-c", "import flotilla.operator.planner as p, flotilla.operator as o; "
               "print(o.__name__, hasattr(o, 'itemgetter'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["flotilla.operator", "False"]
