"""The options of the ``interchange`` data source and sink, as Spark passes them:
strings, names in any case. No Spark."""

from __future__ import annotations

import pickle

import pytest

from gateway.pipeline.options import DEFAULT_ADDRESS, Connection, ReadOptions, WriteOptions
from protocols.segment.blocking import TlsFiles


def test_read_defaults() -> None:
    opts = ReadOptions.parse({"destination": "logs"})
    assert opts.connection == Connection()
    assert opts.connection.address == DEFAULT_ADDRESS
    assert opts.destinations == ("logs",)
    assert (opts.starting, opts.ending) == ("earliest", "latest")
    assert (opts.max_records, opts.max_bytes, opts.fail_on_data_loss) == (None, None, True)
    assert (opts.max_bytes_per_partition, opts.min_partitions) == (64 << 20, 1)


def test_read_options_in_any_case() -> None:
    opts = ReadOptions.parse(
        {
            "ADDRESS": "gw1:12345,gw2:12345",
            "destination": " logs , parts ",
            "startingoffsets": '{"logs": {"0": 128}}',
            "EndingOffsets": "LATEST",
            "maxRecordsPerTrigger": "1000",
            "maxbytesperpartition": "4096",
            "minPartitions": "4",
            "FAILONDATALOSS": "False",
            "timeout": "2.5",
        }
    )
    assert opts.connection.address == "gw1:12345,gw2:12345"
    assert opts.connection.timeout == 2.5
    assert opts.destinations == ("logs", "parts")
    assert (opts.starting, opts.ending) == ({"logs": {0: 128}}, "latest")
    assert (opts.max_records, opts.max_bytes_per_partition, opts.min_partitions) == (1000, 4096, 4)
    assert opts.fail_on_data_loss is False


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({}, "option destination is required"),
        ({"destination": " , "}, "option destination is required"),
        ({"destination": "d", "maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger: expected a"),
        ({"destination": "d", "maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger: expected a"),
        (
            {"destination": "d", "maxRecordsPerTrigger": "5", "maxBytesPerTrigger": "5"},
            "one of maxRecordsPerTrigger and maxBytesPerTrigger",
        ),
        ({"destination": "d", "failOnDataLoss": "yes"}, "failOnDataLoss: expected true or false"),
        ({"destination": "d", "timeout": "-1"}, "option timeout"),
        ({"destination": "d", "startingOffsets": "{"}, "option startingOffsets"),
        ({"destination": "d", "tlsKeyFile": "k.pem"}, "tlsKeyFile needs tlsCertFile"),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ReadOptions.parse(options)


def test_tls_options_travel_as_file_paths() -> None:
    plain = Connection.parse({"tls": "true"})
    assert plain.tls
    assert plain.client().ssl_context == TlsFiles()
    files = Connection.parse(
        {
            "tlsCaFile": "ca.pem",
            "tlsCertFile": "c.pem",
            "tlsKeyFile": "k.pem",
            "tlsServerName": "gw",
        }
    )
    assert files.tls, "a tls* option turns TLS on"
    client = files.client()
    assert client.ssl_context == TlsFiles("ca.pem", "c.pem", "k.pem")
    assert client.server_hostname == "gw"
    assert pickle.loads(pickle.dumps(client)).ssl_context == client.ssl_context
    assert Connection.parse({"tls": "false", "tlsCaFile": "ca.pem"}).client().ssl_context is None


def test_write_options() -> None:
    opts = WriteOptions.parse({"destination": "alerts", "sinkid": " nightly "})
    assert (opts.destination, opts.sink_id) == ("alerts", "nightly")
    assert WriteOptions.parse({"destination": "alerts"}).sink_id is None
    with pytest.raises(ValueError, match="a sink writes one destination"):
        WriteOptions.parse({"destination": "a,b"})
