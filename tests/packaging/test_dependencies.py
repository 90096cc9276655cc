"""The dependency bounds in pyproject.toml are the ones the suite is run against.

`make test-lowest` installs the oldest release each lower bound allows (pinned in
.ci/lowest-constraints.txt) and runs the suite on them. These tests keep that file and
pyproject.toml in step, so a bound cannot be raised or lowered without the oldest run
following it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CONSTRAINTS = REPO / ".ci" / "lowest-constraints.txt"
#: The requirements a user's install takes: the distribution's own and the pipeline's.
INSTALLED = [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["pipeline"]]


def floors() -> dict[str, str]:
    """Each requirement's lower bound (`>=`), by canonical name."""
    found: dict[str, str] = {}
    for line in INSTALLED:
        requirement = Requirement(line)
        for spec in requirement.specifier:
            if spec.operator == ">=":
                found[canonicalize_name(requirement.name)] = spec.version
    return found


def pinned() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][0-9A-Za-z.]*)", line)
        assert match, f"{CONSTRAINTS.name}: {line!r} is not NAME==VERSION"
        found[canonicalize_name(match[1])] = match[2]
    return found


def test_every_lower_bound_is_pinned_in_the_oldest_run_and_nothing_else():
    want, have = floors(), pinned()
    assert sorted(have) == sorted(want), (
        f"{CONSTRAINTS.name} pins {sorted(have)}, pyproject.toml bounds {sorted(want)} from below")
    differ = {name: (want[name], have[name]) for name in want
              if Version(want[name]) != Version(have[name])}  # 3.14 is 3.14.0
    assert not differ, f"(pyproject's bound, the pin) differ: {differ}"


def test_every_dependency_with_internals_the_code_relies_on_has_an_upper_bound():
    """aiohttp: the read deadlines and the client lane drive its RequestHandler's own
    attributes; kopf: the operator's settings; pyspark: a new major changes the engine."""
    bounded = {canonicalize_name(Requirement(line).name) for line in INSTALLED
               if any(s.operator in ("<", "<=", "==") for s in Requirement(line).specifier)}
    assert {"aiohttp", "kopf", "pyspark"} <= bounded, bounded


def test_the_makefile_runs_the_oldest_run_with_those_constraints():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test-lowest:", makefile, re.M), "no test-lowest target"
    assert ".ci/lowest-constraints.txt" in makefile
