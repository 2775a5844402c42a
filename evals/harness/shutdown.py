"""Shutting a long evaluation down without throwing work away: a first SIGINT (Ctrl-C) or
SIGTERM starts no new question and lets the ones in flight finish and be recorded; a second
stops those too (the next run resumes each after its last finished node:
evals.harness.checkpoints).

With `--workers N` (evals.harness.pool) only the parent takes these signals and tells its
workers what to do. A Ctrl-C on a terminal reaches the whole process group, so the parent
starts each worker with the stop signals blocked (`blocked_stop_signals`: none can arrive while
it imports), and the worker swaps them for handlers that do nothing before it lets them in
(`leave_stop_signals_to_parent`). A handler, not SIG_IGN: a process the worker starts (the
embedded server) gets default dispositions back at exec, where an ignored signal would stay
ignored and `mur servers down` could not stop it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED_EXIT = 130  # the shell's status for a command ended by SIGINT

Handler = Callable[[int, FrameType | None], Any] | int | None


def finishing_line(name: str, in_flight: int) -> str:
    """What the first stop signal says."""
    return (
        f"\n{name}: starting no new questions; the {in_flight} in flight finish and are saved. "
        f"{name} again stops them too (they resume from their last finished step next time)."
    )


def cancelling_line(name: str, in_flight: int) -> str:
    """What the second stop signal says."""
    return f"\n{name} again: stopping the {in_flight} questions in flight now"


@contextmanager
def blocked_stop_signals() -> Iterator[None]:
    """This thread takes no stop signal inside the block (one that comes waits, and arrives
    after it); a process started here begins with them blocked."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _parent_decides(signum: int, frame: FrameType | None) -> None:
    """A worker's stop signal handler: the parent took the same signal and says what to do."""


def leave_stop_signals_to_parent() -> None:
    """In a worker started inside `blocked_stop_signals`: stop signals do nothing here from now
    on (those that came meanwhile included)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _parent_decides)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


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
