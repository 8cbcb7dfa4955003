"""``gateway tap``: follow a running gateway's tap over its admin API.

The admin endpoint streams ``GET /api/tap?dest=…&filter=…&format=…`` as one
line per message (chunked HTTP); this prints the lines as they come. The
standard library's HTTP client is enough for one streaming GET.
"""

from __future__ import annotations

import http.client
import sys
import urllib.parse
from typing import TextIO

__all__ = ["DEFAULT_ADMIN_URL", "follow"]

#: Where the embedded default config serves the admin API.
DEFAULT_ADMIN_URL = "http://127.0.0.1:9465"


def follow(
    url: str,
    destination: str,
    *,
    filter: str | None = None,
    fmt: str = "json",
    out: TextIO = sys.stdout,
    limit: int = 0,
) -> int:
    """Print the tap's lines until interrupted (or ``limit`` message lines); exit status."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        print(f"tap: the admin URL must be http://HOST:PORT, not {url!r}", file=sys.stderr)
        return 2
    query = {"dest": destination, "format": fmt}
    if filter:
        query["filter"] = filter
    path = f"{parts.path.rstrip('/')}/api/tap?{urllib.parse.urlencode(query)}"
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=None)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        if response.status != 200:
            reason = response.read().decode("utf-8", "replace").strip()
            print(f"tap: {response.status} {response.reason}: {reason}", file=sys.stderr)
            return 1
        seen = 0
        while line := response.readline():
            out.write(line.decode("utf-8", "replace"))
            out.flush()
            if not line.startswith((b'{"dropped"', b"-- ")):
                seen += 1
                if limit and seen >= limit:
                    break
    except OSError as e:
        print(f"tap: cannot reach the admin API at {url}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()
    return 0
