"""Shared pytest configuration, and the one Spark session of a test run (starting one costs
8-15 s here; every directory's pipeline tests share it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.simulation.test_random_schedules import SUMMARY_KEY

# Speed is measured in benchmarks, never in tests: on a loaded 2-core machine one generated
# example can take longer than Hypothesis's default 200 ms deadline, which says nothing
# about correctness.
settings.register_profile("flotilla", deadline=None)
settings.load_profile("flotilla")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(SUMMARY_KEY, []):
        terminalreporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's --dist loadfile (each module's tests in one worker: modules share clusters
    between their tests, and the simulation's last test checks what its chunks added up to),
    with tests/pipeline as one unit: every test that uses the Spark session is there, and one
    session then serves them all (a session costs a JVM's start and its memory, and Spark's
    tasks take both cores). That unit is the longest, so it is handed out first, and the other
    worker runs the rest meanwhile (xdist's own order, by number of tests, left it for last:
    one worker then ran it alone for minutes)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # units in collection order (modifyitems below)

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/pipeline" if scope.startswith("tests/pipeline/") else scope

    return Scheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker, the Spark tests come first (the scheduler hands units out in this
    order; every worker collects the same order, which the scheduler's indexes rely on)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not item.nodeid.startswith("tests/pipeline/"))  # stable


# Under pytest-xdist the summary lines are made in a worker: they travel to the controller in
# the worker's output, and the controller prints them.
def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["flotilla_summary"] = session.config.stash.get(SUMMARY_KEY, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    lines = getattr(node, "workeroutput", {}).get("flotilla_summary", [])
    node.config.stash.setdefault(SUMMARY_KEY, []).extend(lines)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Its Python workers fork from a daemon that keeps the environment of the moment Spark
    starts, so the emulators' dummy AWS credentials go in first: tests reading moto_server
    through Spark then work whichever test started it."""
    pytest.importorskip("pyspark", reason="the pipeline extra is not installed: "
                        "pip install 'flotilla[pipeline]'")
    from flotilla.pipeline.spark import spark_session

    from tests.archive.stores import aws_environment
    from tests.archive_node.support import REGION

    env = {**aws_environment(tmp_path_factory.mktemp("spark-aws")),
           "AWS_DEFAULT_REGION": REGION}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        session = spark_session("local[2]", app="flotilla-tests")
        try:
            yield session
        finally:
            session.stop()
