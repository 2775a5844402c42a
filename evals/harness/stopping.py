"""Stopping a long benchmark without throwing work away.

A benchmark question can take half an hour of server time, and a run holds many in flight.
So a first SIGINT (Ctrl-C) or SIGTERM starts no new question and lets the ones in flight
finish and be recorded; a second stops those too (the next run of the same command resumes
each after its last finished node: evals.harness.checkpoints). Celery's warm and cold shutdown, and
Scrapy's Ctrl-C, work the same way.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED_EXIT = 130  # the shell's status for a command ended by SIGINT

Handler = Callable[[int, FrameType | None], Any] | int | None


class StopSignals:
    """While entered (inside a running event loop): the first stop signal sets `requested`
    and calls `on_first(name)`; the next sets `forced` and calls `on_second(name)`. On exit
    the process's previous handlers are back. Off the main thread (an app embedding the
    runner) Python cannot take signals, so nothing is installed and nothing is requested."""

    def __init__(self, on_first: Callable[[str], None], on_second: Callable[[str], None]) -> None:
        self.on_first, self.on_second = on_first, on_second
        self.requested: str | None = None  # the name of the signal that asked to stop
        self.forced = False
        self._previous: dict[signal.Signals, Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _received(self, sig: signal.Signals) -> None:
        if self.requested is None:
            self.requested = sig.name
            self.on_first(sig.name)
        elif not self.forced:
            self.forced = True
            self.on_second(sig.name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            self._loop.add_signal_handler(sig, self._received, sig)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._loop is None:
            return
        for sig, previous in self._previous.items():
            self._loop.remove_signal_handler(sig)
            signal.signal(sig, previous)
        self._previous.clear()
        self._loop = None
