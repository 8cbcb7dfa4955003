"""The running gateway, a module per room: the gateway's life (``gateway``), listeners
(``listener``), one connection (``connection``, ``stream``), upstreams (``upstreams``),
the drain (``drain``), plugins (``plugins``), the metrics and admin endpoints
(``endpoints``), the snapshot operations read (``snapshot``), and what they share
(``state``); plus accepting (``accept``), the destination catalog (``catalog``) and
plugin discovery (``registry``)."""
