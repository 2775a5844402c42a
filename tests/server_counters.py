"""Reading a server counter that other requests may still be moving: the servers' own
`settled` (servers/clients/metrics.py), which the benchmarks use too."""

from __future__ import annotations

from mur.servers.clients.metrics import settled

__all__ = ["settled"]
