"""The image (Dockerfile, .dockerignore), checked without a Docker engine.

The Dockerfile is parsed into stages and instructions; what the final image would run, as whom
and with what, is asserted from that. The builder stage's sources are also built here (offline,
with this venv's setuptools), to prove that what it copies is a complete distribution.
Building and running the real image needs a Docker engine: that test runs only with
FLOTILLA_DOCKER_BUILD=1 and an engine that answers `docker info`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|cmake|python3?-dev|"
                         r"libc6?-dev|cargo|rustc)\b")


@dataclass
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        return json.loads(self.args)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]


def logical_lines(text: str) -> list[str]:
    """Instructions with their continuation lines joined; comments and blanks dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "the Dockerfile ends inside a continued instruction"
    return lines


def parse() -> tuple[dict[str, str], list[Stage]]:
    """(the global ARG defaults, the stages in order)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(DOCKERFILE.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, not {keyword}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, args.strip()))
    return global_args, stages


def final_stage() -> Stage:
    return parse()[1][-1]


def builder_stage() -> Stage:
    (builder,) = [s for s in parse()[1] if s.name == "builder"]
    return builder


def copy_sources(stage: Stage) -> list[str]:
    """Sources of the stage's COPY instructions that read the build context."""
    sources: list[str] = []
    for instruction in stage.all("COPY"):
        words = shlex.split(instruction.args)
        if any(w.startswith("--from") for w in words):
            continue
        sources.extend(w for w in words[:-1] if not w.startswith("--"))
    return sources


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            env[key] = value.replace("$PATH", "").replace("${PATH}", "")
    return env


# --- .dockerignore, as Docker reads it ------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    patterns = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        patterns.append((negated, _pattern_regex(line.lstrip("!").strip("/"))))
    return patterns


def ignored(path: str) -> bool:
    """Whether Docker leaves `path` out of the build context: the last pattern that matches
    the path or one of its parent directories decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for negated, regex in ignore_patterns():
        if any(regex.match(prefix) for prefix in prefixes):
            verdict = not negated
    return verdict


# --- stages and base image --------------------------------------------------------------------


def test_two_stages_from_python_311_slim_on_bookworm():
    """Bookworm: the Debian release whose packages hold Java 17 (Debian 13 has none)."""
    global_args, stages = parse()
    assert global_args.get("PYTHON_IMAGE") == "python:3.11-slim-bookworm"
    assert [s.base for s in stages] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert stages[0].name == "builder"
    assert stages[-1].name is None


def test_the_builder_makes_wheels_and_the_final_stage_installs_only_those():
    assert any("pip wheel" in r.args for r in builder_stage().all("RUN"))
    installs = [r.args for r in final_stage().all("RUN") if re.search(r"\bpip\b", r.args)]
    assert installs, "the final stage installs the wheels"
    for args in installs:
        assert "--no-index" in args, "the final stage must not fetch or compile anything"
        assert "from=builder" in args


# --- what the image runs, and as whom -------------------------------------------------------


def test_the_final_stage_runs_as_user_10001_not_root():
    user = final_stage().last("USER").args
    uid, _, gid = user.partition(":")
    assert uid == "10001", f"USER {user}: numeric, so runAsNonRoot can verify it"
    assert gid in ("", "10001")
    run = " ".join(r.args for r in final_stage().all("RUN"))
    assert "--uid 10001" in run and "--gid 10001" in run


def test_the_data_directory_is_writable_by_that_user():
    run = " ".join(r.args for r in final_stage().all("RUN"))
    assert "mkdir -p /var/lib/flotilla" in run
    assert "chown 10001:10001 /var/lib/flotilla" in run


def test_entrypoint_is_flotilla_with_help_by_default():
    stage = final_stage()
    assert stage.last("ENTRYPOINT").exec_form() == ["flotilla"]
    assert stage.last("CMD").exec_form() == ["--help"]


def test_every_console_script_is_on_path():
    stage = final_stage()
    env = env_of(stage)
    venv = env["VIRTUAL_ENV"]
    assert f"{venv}/bin" in env["PATH"].split(":")
    install = " ".join(r.args for r in stage.all("RUN"))
    assert 'python -m venv --without-pip "$VIRTUAL_ENV"' in install
    assert '--python "$VIRTUAL_ENV/bin/python"' in install
    # this test names them all: the command and the kubectl plugin
    assert set(PYPROJECT["project"]["scripts"]) == {"flotilla", "kubectl-flotilla"}


def test_no_build_tools_in_the_final_stage():
    for run in final_stage().all("RUN"):
        assert not BUILD_TOOLS.search(run.args), f"build tools in the final image: {run.args}"


def test_the_pipeline_and_java_17_are_in_by_default_and_can_be_left_out():
    """The operator runs the pipeline's snapshot-at as a Job in the cluster's image."""
    assert "pipeline" in PYPROJECT["project"]["optional-dependencies"]
    for stage in (builder_stage(), final_stage()):
        assert Instruction("ARG", 'FLOTILLA_EXTRAS="pipeline"') in stage.instructions
    (java,) = [r.args for r in final_stage().all("RUN") if "apt-get install" in r.args]
    assert "*,pipeline,*)" in java  # only with the extra
    assert "--no-install-recommends openjdk-17-jre-headless" in java
    assert "rm -rf /var/lib/apt/lists/*" in java
    assert "--build-arg FLOTILLA_EXTRAS= " in DOCKERFILE.read_text()


def test_labels_follow_opencontainers():
    labels = " ".join(i.args for i in final_stage().all("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    arg_defaults = dict(a.args.partition("=")[::2] for a in final_stage().all("ARG"))
    assert arg_defaults["VERSION"] == PYPROJECT["project"]["version"]
    assert PYPROJECT["project"]["license"] in labels  # an SPDX expression


def test_every_variable_docker_substitutes_is_declared_in_its_stage():
    """An ARG before the first FROM is invisible inside a stage unless declared again there:
    a label or ENV reading it would silently be empty."""
    for stage in parse()[1]:
        declared = {"PATH"}  # from the base image
        for instruction in stage.instructions:
            if instruction.keyword in ("LABEL", "ENV", "WORKDIR", "USER", "COPY", "EXPOSE"):
                used = set(re.findall(r"\$\{?(\w+)", instruction.args))
                assert used <= declared, f"{instruction.keyword} {instruction.args}: " \
                                         f"{sorted(used - declared)} not declared in the stage"
            if instruction.keyword == "ARG":
                declared.add(instruction.args.partition("=")[0])
            if instruction.keyword == "ENV":
                declared |= {w.partition("=")[0] for w in shlex.split(instruction.args)}


# --- the build context ------------------------------------------------------------------------


def test_every_copy_source_exists_and_is_in_the_build_context():
    for stage in parse()[1]:
        for source in copy_sources(stage):
            assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
            assert not ignored(source), f"COPY {source}: excluded by .dockerignore"


def test_the_builder_copies_everything_the_distribution_is_built_from():
    copied = {s.rstrip("/") for s in copy_sources(builder_stage())}
    tool = PYPROJECT["tool"]["setuptools"]
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], *tool["package-dir"].values()}
    assert needed <= copied, f"not copied into the builder: {sorted(needed - copied)}"


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".venv-lowest/bin/python", ".git/HEAD", ".pytest_cache/v/cache/lastfailed",
    ".ruff_cache/0.5.0/x", ".hypothesis/examples/x", "node/__pycache__/server.cpython-311.pyc",
    "flotilla.egg-info/PKG-INFO", ".flotilla/n1/data/wal-0001", ".flotilla/archive/x",
    "bench/results/run.json", "tests/conftest.py", "e2e/test_kind.py", "build/lib/x.py",
])
def test_dockerignore_keeps_out(path):
    assert ignored(path)


@pytest.mark.parametrize("path", [
    "pyproject.toml", "README.md", "flotilla/cli.py", "node/archive/__init__.py",
    "node/runtime.py", "operator/__init__.py",
])
def test_dockerignore_keeps_in(path):
    assert not ignored(path)


def test_the_builder_sources_build_every_package_and_script(tmp_path):
    """The builder's COPY set, built offline (setuptools' build_py and egg_info, what the
    wheel is made of), holds every package pyproject.toml lists and the console scripts: what
    the image installs is the whole distribution."""
    context = tmp_path / "context"
    for source in copy_sources(builder_stage()):
        target = context / source
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / source, target)
    lib, meta = tmp_path / "lib", tmp_path / "meta"
    meta.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "egg_info",
         "--egg-base", str(meta), "build_py", "--build-lib", str(lib)],
        cwd=context, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        assert (lib / package.replace(".", "/") / "__init__.py").is_file(), package
    entry_points = (meta / "flotilla.egg-info" / "entry_points.txt").read_text()
    for script, target in PYPROJECT["project"]["scripts"].items():
        assert f"{script} = {target}" in entry_points


# --- the real image (needs a Docker engine) -------------------------------------------------


def docker_engine() -> str:
    if os.environ.get("FLOTILLA_DOCKER_BUILD") != "1":
        pytest.skip("set FLOTILLA_DOCKER_BUILD=1 to build and run the image (needs a Docker "
                    "engine and network access to PyPI)")
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on PATH")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        pytest.skip(f"no Docker engine: {reason}")
    return docker


def test_the_image_builds_runs_flotilla_as_10001_and_has_no_compiler():
    docker = docker_engine()
    tag = "flotilla:packaging-test"
    build = subprocess.run([docker, "build", "-t", tag, str(REPO)], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-4000:]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([docker, "run", "--rm", *args], capture_output=True, text=True,
                              timeout=120)

    assert "usage: flotilla" in run(tag).stdout
    assert run("--entrypoint", "id", tag, "-u").stdout.strip() == "10001"
    assert run("--entrypoint", "sh", tag, "-c", "command -v gcc cc").returncode != 0
    writable = run("--entrypoint", "sh", tag, "-c", "touch /var/lib/flotilla/x && echo ok")
    assert writable.stdout.strip() == "ok"
    assert run("--entrypoint", "python", tag, "-c", "import operator; operator.add").returncode \
        == 0
    # what the restore Job runs: Spark on Java 17, from a read-only root
    assert 'version "17.' in run("--entrypoint", "java", tag, "-version").stderr
    assert run("--read-only", tag, "pipeline", "snapshot-at", "--help").returncode == 0
    assert run("--entrypoint", "python", tag, "-c", "import pyspark, pyarrow").returncode == 0
