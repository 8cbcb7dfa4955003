"""A Spark session for the gateway's pipeline: quiet, and local unless told otherwise.

Spark's defaults suit a cluster shell, not a job run from a terminal or a test: a
progress bar and INFO lines on stderr, a web UI port, 200 shuffle partitions for
tiny data. :func:`local_session` starts a session the way the pipeline wants it,
and registers the ``interchange`` data source. On ``local[...]`` masters
everything listens on loopback only; on a cluster the driver must be reachable by
the executors, so the bind settings are left to Spark.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["LOG4J_CONFIG", "local_session"]

#: Spark's JVM logging config: errors only.
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def local_session(
    master: str = "local[*]",
    *,
    app_name: str = "interchange-pipeline",
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A started SparkSession on ``master`` with the ``interchange`` data source
    registered. ``PYSPARK_PYTHON`` is set to this interpreter unless already set, so
    Spark's Python workers import the same packages as the driver."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from gateway.pipeline import register

    log4j = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", log4j)
        .config("spark.executor.extraJavaOptions", log4j)
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    partitions = shuffle_partitions or (_local_cores(master) if local else None)
    if partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
        builder = builder.config("spark.default.parallelism", str(partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _local_cores(master: str) -> int:
    """The thread count of a ``local[N]`` / ``local[*]`` / ``local`` master."""
    inside = master[len("local") :].strip("[]").split(",")[0]
    if inside == "*":
        return os.cpu_count() or 1
    return int(inside) if inside else 1
