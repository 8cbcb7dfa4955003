"""Durable destinations: logs kept in the storage engine (`gateway.store`).

The adapters between the core's log model and the engine: `DurableLog`
(one segment per log), `PartitionedLog` (N logs behind one name) and the
stored message envelope.
"""
