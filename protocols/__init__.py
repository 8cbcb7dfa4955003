"""Interchange's built-in protocols: each a sans-IO codec plus the trio driver that runs it."""
