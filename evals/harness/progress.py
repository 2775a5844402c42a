"""Progress of an evaluation run: a rich bar on a terminal, plain lines everywhere else (a log
file, nohup.out, a CI console, where a live bar shows nothing until the end): a line every few
questions, and at least every minute:

    progress: 15/400 questions (3.8%), 0 failed, 2.1 q/min, 34 tok/s, elapsed 7m08s, ETA 3h03m

Counting only finished questions misleads early in a run with many in flight (tok/s near 0,
the ETA hours too long). Given a live count of the tokens produced (`live_tokens`, questions in
flight included), tok/s is that count's rate over the last `WINDOW` seconds (so a resumed or
slowed run shows the speed it has now), and the ETA is the tokens still expected, less those
in flight have spent, at that rate. Settings differ widely in cost and the cheap ones finish
first, so each question left is priced at the mean of its own setting's finished questions
(the folder's earlier records included), else at the mean of all.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from statistics import fmean
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

EVERY = 5  # questions between two plain lines
INTERVAL = 60.0  # seconds: the longest silence without a line
WINDOW = 600.0  # seconds of recent history behind tok/s and the ETA
ALL = ""  # the one setting of questions given without their settings


def duration(seconds: float) -> str:
    """45s, 7m08s, 3h03m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class RunProgress:
    """Counts questions as they finish or fail and shows it (a bar on a terminal ``stream``, plain
    lines every ``every`` questions or ``interval`` seconds otherwise); use as ``async with``.
    ``live_tokens``: tokens produced so far, in flight included (a run-wide
    `nodes.usage.metered`); ``settings``: each question's `setting_of` (one for all when left
    out); ``recorded``: (setting, tokens) of questions finished before this run."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        every: int = EVERY,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        live_tokens: Callable[[], int] | None = None,
        window: float = WINDOW,
        settings: Sequence[str] | None = None,
        recorded: Iterable[tuple[str, int]] = (),
    ) -> None:
        if settings is not None and len(settings) != total:
            raise ValueError(f"{len(settings)} settings given for {total} questions")
        self.total, self.every, self.interval, self.clock = total, every, interval, clock
        self._left = Counter(settings if settings is not None else [ALL] * total)
        self._costs: defaultdict[str, list[int]] = defaultdict(list)  # tokens per finished one
        for setting, tokens in recorded:
            self._costs[setting].append(tokens)
        self.live_tokens, self.window = live_tokens, window
        self._samples: deque[tuple[float, int]] = deque()  # (time, tokens produced by then)
        self.stream = stream if stream is not None else sys.stderr
        console = Console(file=self.stream)
        # rich's own test: isatty, unless TTY_COMPATIBLE / FORCE_COLOR say otherwise.
        self.plain = enabled and (not console.is_terminal or console.is_dumb_terminal)
        self.finished = self.failed = 0
        self.tokens = 0  # made in this run for the questions finished
        self.started = self.last_line = clock()
        self._samples.append((self.started, 0))
        self.shown = -1  # the count of questions the last plain line reported
        self._heartbeat: asyncio.Task[None] | None = None
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled or self.plain,
            transient=False,
        )
        self.task = self.bar.add_task("questions", total=total, rate="")

    @property
    def done(self) -> int:
        return self.finished + self.failed

    def _produced(self) -> int:
        """Tokens produced so far: the live count, else those of finished questions."""
        return self.live_tokens() if self.live_tokens is not None else self.tokens

    def _token_rate(self, now: float, produced: int) -> float:
        """Tokens per second over the last ``window`` seconds (since the start, when shorter).

        The oldest sample kept is the newest one at least ``window`` old, so the rate always
        spans a full window once the run is that long."""
        samples = self._samples
        samples.append((now, produced))
        while len(samples) > 2 and now - samples[1][0] >= self.window:
            samples.popleft()
        since, before = samples[0]
        return (produced - before) / max(now - since, 1e-9)

    def _rates(self) -> tuple[float, float, float]:
        now = self.clock()
        elapsed = max(now - self.started, 1e-9)
        return elapsed, self.finished / elapsed * 60, self._token_rate(now, self._produced())

    def tokens_left(self) -> float | None:
        """What the questions not done should cost in all, each at its setting's mean; None
        while no question has finished, in this run or recorded before it."""
        every = [tokens for costs in self._costs.values() for tokens in costs]
        if not every:
            return None
        overall = fmean(every)
        return sum(
            left * (fmean(self._costs[setting]) if self._costs[setting] else overall)
            for setting, left in self._left.items()
        )

    def _eta(self, elapsed: float, tokens_per_s: float) -> str:
        remaining = self.total - self.done
        if remaining <= 0:
            return "done"
        tokens_left = self.tokens_left()
        if self.live_tokens is not None and tokens_left is not None and tokens_per_s > 0:
            in_flight = self._produced() - self.tokens  # made for questions not yet finished
            expected = tokens_left - in_flight
            if expected > 0:
                return f"ETA {duration(expected / tokens_per_s)}"
        if not self.done:
            return "ETA unknown"
        return f"ETA {duration(remaining * elapsed / self.done)}"

    def line(self) -> str:
        """The plain progress line for the counts so far."""
        elapsed, per_minute, tokens_per_s = self._rates()
        share = self.done / self.total * 100 if self.total else 100.0
        return (
            f"progress: {self.done}/{self.total} questions ({share:.1f}%), {self.failed} failed, "
            f"{per_minute:.1f} q/min, {tokens_per_s:.0f} tok/s, elapsed {duration(elapsed)}, "
            f"{self._eta(elapsed, tokens_per_s)}"
        )

    def _emit(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.last_line, self.shown = self.clock(), self.done

    def finished_one(self, tokens: int, setting: str = ALL, *, here: int | None = None) -> None:
        """A question of ``setting`` finished, having cost ``tokens``, ``here`` of them made in
        this run (all when None; a question resumed from its checkpoint made the rest before)."""
        self.finished += 1
        self.tokens += tokens if here is None else here
        self._costs[setting].append(tokens)
        self._left[setting] -= 1
        self._show()

    def failed_one(self, setting: str = ALL) -> None:
        """A question of ``setting`` failed: done, at no cost to price the others by."""
        self.failed += 1
        self._left[setting] -= 1
        self._show()

    def _show(self) -> None:
        elapsed, per_minute, tokens_per_s = self._rates()
        # The bar shows the same ETA as the lines (rich's own counts finished questions only).
        rate = (
            f"{per_minute:.1f} q/min  {tokens_per_s:.0f} tok/s  {self._eta(elapsed, tokens_per_s)}"
        )
        self.bar.update(self.task, completed=self.done, rate=rate)
        if not self.plain:
            return
        due = self.done % self.every == 0 or self.done == self.total
        if due or self.clock() - self.last_line >= self.interval:
            self._emit()

    async def _beat(self) -> None:
        """A line after ``interval`` seconds without one, even when no question finishes."""
        while True:
            await asyncio.sleep(max(self.interval - (self.clock() - self.last_line), 0.01))
            if self.clock() - self.last_line >= self.interval:
                self._emit()

    async def __aenter__(self) -> RunProgress:
        self.started = self.last_line = self.clock()
        self._samples.clear()
        self._samples.append((self.started, self._produced()))
        if self.plain:
            self._emit()
            self._heartbeat = asyncio.create_task(self._beat())
        else:
            self.bar.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self.plain:
            if self.done != self.shown:  # the final count, unless the last line showed it
                self._emit()
        else:
            self.bar.stop()
