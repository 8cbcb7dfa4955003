"""The core model and hub: messages, receipts, destinations, topics, logs.

Nothing here knows a wire protocol, a socket or a file: the hub routes
`Message`s to `Destination`s and settles `Receipt`s; topics and logs keep
them in memory; `gateway.durable` puts logs on the storage engine.
"""
