"""Interchange: a multi-protocol message gateway on trio.

The package is the host: the message model (:mod:`gateway.core.model`), the hub
(:mod:`gateway.core.hub`), the runtime that runs listeners and upstreams
(:mod:`gateway.runtime.gateway`), transports, config and the command line. Protocols
live in their own packages and register through entry points.
"""

__version__ = "0.1.0"
