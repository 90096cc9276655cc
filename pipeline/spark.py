"""Starting Spark, and saying in one line what is missing when it cannot start."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import Any

__all__ = ["PipelineError", "spark_session", "task_failure"]

LOG_CONFIG = os.path.join(os.path.dirname(__file__), "log4j2.properties")


class PipelineError(Exception):
    """Something the user must act on; the message says what. `exit_code` is the pipeline's:
    1 (the job failed), 2 (bad flags) or 4 (a target outside the archive)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _require_pyspark() -> Any:
    try:
        import pyspark
    except ImportError:
        raise PipelineError("the pipeline needs PySpark: pip install 'flotilla[pipeline]'",
                            2) from None
    return pyspark


def _require_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return
    if shutil.which("java"):
        return
    raise PipelineError("Spark needs a Java runtime (17 or 21) and none was found: install one "
                        "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME", 2)


def spark_session(master: str | None = "local[*]", app: str = "flotilla-pipeline") -> Any:
    """A Spark session on `master` (any Spark master URL). None: the master spark-submit was
    given when it launched this driver, else `local[*]`. Local mode binds to loopback unless
    SPARK_LOCAL_IP says otherwise."""
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM already
    if master is None and not submitted:
        master = "local[*]"
    _require_pyspark()
    _require_java()
    # The driver's JVM starts before any session config applies: its log4j2 settings go
    # through the launcher's environment.
    opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if "log4j.configurationFile" not in opts:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} -Dlog4j.configurationFile={LOG_CONFIG}".strip()
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Workers run this interpreter, which has flotilla installed; elsewhere the cluster's
        # image decides (the project's image has it).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    local = bool(master and master.startswith("local"))
    driver_opts = f"-Dlog4j.configurationFile={LOG_CONFIG}"
    if local:
        # In local mode the tasks run in the driver's JVM, for one short job: its C2
        # compiler's threads spent 3.5-4 CPU seconds of a 3M-entry snapshot-at still
        # compiling, on the cores the tasks need (docs/pipeline.md#how-fast). C1 alone
        # compiles what moves the blobs well enough.
        driver_opts += " -XX:TieredStopAtLevel=1"
        # Shuffle files never leave the machine, and what they hold is Arrow blobs of
        # values that rarely compress: compressing them only costs the JVM's CPU.
        builder = (builder.config("spark.shuffle.compress", "false")
                   .config("spark.shuffle.spill.compress", "false"))
    builder = (builder
               .config("spark.ui.enabled", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.shuffle.partitions",
                       str(max(2, os.cpu_count() or 2)) if local else "200")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", driver_opts)
               .config("spark.executor.extraJavaOptions",
                       f"-Dlog4j.configurationFile={LOG_CONFIG}"))
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # the JVM did not start: the first line of its complaint
        raise PipelineError(f"Spark did not start on {master or 'the submitted master'}: "
                            f"{str(exc).strip().splitlines()[0]}") from None
    session.sparkContext.setLogLevel("ERROR")
    return session


def task_failure(exc: BaseException) -> str | None:
    """The one line that matters in a failed Spark job's exception: the Python error a task
    raised (an archive object that does not verify, say), else the first line. None when
    `exc` is not Spark's."""
    module = type(exc).__module__ or ""
    if not module.startswith(("pyspark", "py4j")):
        return None
    text = str(exc)
    for line in text.splitlines():
        for marker in ("ArchiveCorrupt: ", "ArchiveNotFound: ", "ArchiveError: "):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
