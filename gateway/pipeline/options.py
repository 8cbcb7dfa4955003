"""The options of the ``interchange`` data source and sink, parsed and checked once.

Spark hands a data source its options as strings, case-insensitively
(``.option("maxRecordsPerTrigger", "1000")``). They are parsed here into frozen
dataclasses that travel to Spark's executors by pickling: file paths for TLS,
not an ``ssl.SSLContext`` (which cannot be pickled); each process builds the
context and its connection when it first needs one.

Connection (source and sink):

==================  =========================================================
``address``         ``host:port`` of the gateway's segment-append listener, or
                    a comma list tried in turn (default ``127.0.0.1:12345``)
``timeout``         seconds a socket operation may take (default 30)
``tls``             ``true``: connect with TLS (default: true when one of the
                    ``tls*`` options below is given, else false)
``tlsCaFile``       the CA bundle of the gateway's certificate (default: the
                    system's)
``tlsCertFile``,    a client certificate and its key, for a listener that asks
``tlsKeyFile``      for one
``tlsServerName``   the name the certificate must carry (default: the host)
==================  =========================================================

Source: ``destination`` (required; a comma list reads several),
``startingOffsets`` (``earliest``, the default, ``latest`` or JSON),
``endingOffsets`` (batch reads: ``latest``, the default, or JSON),
``maxRecordsPerTrigger`` or ``maxBytesPerTrigger`` (streaming; at most one),
``maxBytesPerPartition`` (default 64 MiB), ``minPartitions`` (default 1: one
Spark task per partition range; set it to the cores to read a one-partition
destination with all of them), ``failOnDataLoss`` (default true).
Sink: ``destination`` (required, one), ``sinkId``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.pipeline.planning import DEFAULT_MAX_BYTES_PER_PARTITION, OffsetSpec, parse_offsets
from protocols.segment.blocking import SegmentClient, TlsFiles

__all__ = ["DEFAULT_ADDRESS", "Connection", "ReadOptions", "WriteOptions"]

#: The segment-append listener of the default configuration.
DEFAULT_ADDRESS = "127.0.0.1:12345"
#: ``minPartitions`` unless given: one Spark task per range, as Kafka's source
#: reads one per Kafka partition. Not the machine's cores: a replayed micro-batch
#: must be cut into the same tasks wherever the driver restarts, or the sink's
#: writer ids (which follow Spark's partitions) change and rows are written twice.
DEFAULT_MIN_PARTITIONS = 1

_TLS_FILES = ("tlscafile", "tlscertfile", "tlskeyfile", "tlsservername")


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    value = opts.get(name.lower())
    if value is None:
        return default
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise ValueError(f"option {name}: expected true or false, not {value!r}")
    return word == "true"


def _positive(opts: Mapping[str, str], name: str) -> int | None:
    value = opts.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"option {name}: expected a positive integer, not {value!r}")
    return number


def _destinations(opts: Mapping[str, str]) -> tuple[str, ...]:
    names = tuple(d.strip() for d in opts.get("destination", "").split(",") if d.strip())
    if not names:
        raise ValueError("option destination is required: the gateway destination to use")
    return names


@dataclass(frozen=True)
class Connection:
    """How to reach the gateway: address(es), timeout and TLS."""

    address: str = DEFAULT_ADDRESS
    timeout: float = 30.0
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Connection:
        opts = _lower(options)
        try:
            timeout = float(opts.get("timeout", "30"))
        except ValueError:
            timeout = 0.0
        if not timeout > 0:
            raise ValueError(f"option timeout: expected seconds > 0, not {opts['timeout']!r}")
        if bool(opts.get("tlskeyfile")) and not opts.get("tlscertfile"):
            raise ValueError("option tlsKeyFile needs tlsCertFile")
        return cls(
            address=opts.get("address", DEFAULT_ADDRESS).strip() or DEFAULT_ADDRESS,
            timeout=timeout,
            tls=_bool(opts, "tls", any(opts.get(k) for k in _TLS_FILES)),
            ca_file=opts.get("tlscafile") or None,
            cert_file=opts.get("tlscertfile") or None,
            key_file=opts.get("tlskeyfile") or None,
            server_name=opts.get("tlsservername") or None,
        )

    def client(self) -> SegmentClient:
        """A new client (it connects on first use)."""
        tls = TlsFiles(self.ca_file, self.cert_file, self.key_file) if self.tls else None
        return SegmentClient(
            self.address,
            ssl_context=tls,
            server_hostname=self.server_name,
            timeout=self.timeout,
        )


@dataclass(frozen=True)
class ReadOptions:
    """The options of a read (batch or streaming)."""

    connection: Connection
    destinations: tuple[str, ...]
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    max_records: int | None = None
    max_bytes: int | None = None
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    min_partitions: int = DEFAULT_MIN_PARTITIONS
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """The options Spark gave; ValueError naming the first bad one."""
        opts = _lower(options)
        max_records = _positive(opts, "maxRecordsPerTrigger")
        max_bytes = _positive(opts, "maxBytesPerTrigger")
        if max_records is not None and max_bytes is not None:
            raise ValueError("set one of maxRecordsPerTrigger and maxBytesPerTrigger, not both")
        return cls(
            connection=Connection.parse(opts),
            destinations=_destinations(opts),
            starting=parse_offsets(
                opts.get("startingoffsets", "earliest"), option="startingOffsets"
            ),
            ending=parse_offsets(opts.get("endingoffsets", "latest"), option="endingOffsets"),
            max_records=max_records,
            max_bytes=max_bytes,
            max_bytes_per_partition=_positive(opts, "maxBytesPerPartition")
            or DEFAULT_MAX_BYTES_PER_PARTITION,
            min_partitions=_positive(opts, "minPartitions") or DEFAULT_MIN_PARTITIONS,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        )


@dataclass(frozen=True)
class WriteOptions:
    """The options of a write (batch or streaming)."""

    connection: Connection
    destination: str
    sink_id: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """The options Spark gave; ValueError naming the first bad one."""
        opts = _lower(options)
        destinations = _destinations(opts)
        if len(destinations) > 1:
            raise ValueError(
                f"option destination: a sink writes one destination, not {','.join(destinations)}"
            )
        return cls(
            connection=Connection.parse(opts),
            destination=destinations[0],
            sink_id=opts.get("sinkid", "").strip() or None,
        )
