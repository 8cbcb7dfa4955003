"""The protocol toolkit: what every protocol's codec and driver share.

Protocols import these through :mod:`gateway.sdk`, never from here.

* :mod:`.events`: a sans-IO codec's vocabulary, ``NEED_DATA`` and
  ``ConnectionClosed`` (the errors are in :mod:`gateway.core.errors`);
* :mod:`.lifecycle`: the codec lifecycle every codec shares (open, closed,
  error; ``WrongState``; ``held_bytes``);
* :mod:`.buffer`: ``ReceiveBuffer``, received bytes parsed by offset;
* :mod:`.conformance`: the checks every codec passes, and ``splits``;
* :mod:`.answers`: ``Answers``, what a connection owes its peer until each
  receipt settles;
* :mod:`.session`: ``Session``, the driver skeleton (reader, writer, answers,
  deadlines, drain) that a protocol's trio layer subclasses;
* :mod:`.subscriber` and :mod:`.tags`: the subscriber side (one pump per
  subscription, windows and demand, the peer-tag table, cumulative acks);
* :mod:`.guard` and :mod:`.counts`: a connection's memory and progress guard,
  and the counters a protocol reports;
* :mod:`.plugin` and :mod:`.options`: the plugin interface and its config keys.

The modules a codec needs (events, lifecycle, buffer) import no I/O library.
"""
