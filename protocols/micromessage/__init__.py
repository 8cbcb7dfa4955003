"""Micromessage2 (MicroMsg2), in both roles: the protocol of SharpMessaging.

Built in layers, each sans I/O:

* :mod:`.events`: the frames as frozen dataclasses, the flag bits and limits;
* :mod:`.frames`: a frame to bytes and an incremental decoder back (the
  frame layer, which starts after the handshake).

The handshake, extension negotiation, acks and pub/sub belong to the codec,
which is built on these.
"""
