"""Waiting for something another process or thread does, without a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout: float, every: float = 0.02) -> bool:
    """Whether `condition()` became true within `timeout` seconds (asked every `every` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()
