"""Reading a server counter that other requests may still be moving (tests only)."""

from __future__ import annotations

import time
from collections.abc import Callable


def settled(read: Callable[[], int], quiet: float = 2.0, timeout: float = 60) -> int:
    """The value of `read()` once it has not moved for `quiet` seconds."""
    value, since, deadline = read(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"still moving after {timeout} s"
        time.sleep(0.25)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value
