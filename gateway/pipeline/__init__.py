"""The data pipeline on Apache Spark: a PySpark data source and sink named
``interchange`` over the gateway's durable destinations, and the
``gateway pipeline`` example job.

Nothing here imports trio or the gateway's runtime: Spark runs this code in its
own Python workers, on this machine or on a cluster's executors, and they reach
the gateway over its segment-append listener (the blocking client of
:mod:`protocols.segment.blocking`). Register the data source once per session::

    from gateway.pipeline import register
    register(spark)
    df = (spark.read.format("interchange").option("address", "gw:12345")
          .option("destination", "logs").load())
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``interchange`` data source with ``spark`` (a SparkSession)."""
    from gateway.pipeline.source import InterchangeDataSource

    spark.dataSource.register(InterchangeDataSource)
