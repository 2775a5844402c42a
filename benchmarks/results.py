"""What each measurement produced: graph runs, replays, raw throughput, n-choice runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from mur.benchmarks.analysis import ClientTime, client_time
from mur.benchmarks.counters import Counters, add_counters, ratio
from mur.benchmarks.recording import RecordedRequest


@dataclass
class GraphRun:
    """One graph run over a set of questions, with what it cost and what it sent."""

    label: str
    strategy: str
    gate: str
    concurrency: int
    questions: int
    wall_s: float = 0.0
    cpu_s: float = 0.0
    server: Counters = field(default_factory=Counters)
    backbone_tokens: int = 0
    external_tokens: int = 0
    calls: int = 0
    steps_total: int = 0
    steps_scaled: int = 0
    scaled_by_step: dict[int, tuple[int, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    window_s: float | None = None
    window: Counters | None = None

    @property
    def total_tokens(self) -> int:
        return self.backbone_tokens + self.external_tokens

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per second of the whole run (the server's count)."""
        return ratio(self.server.generation_tokens, self.wall_s)

    @property
    def window_tokens_per_s(self) -> float | None:
        """Tokens/s of the window in which every slot always had a question."""
        return ratio(self.window.generation_tokens if self.window else None, self.window_s)

    @property
    def client(self) -> ClientTime:
        return client_time(self.requests, self.spans)


@dataclass
class ReplayRun:
    label: str
    wall_s: float
    cpu_s: float
    server: Counters
    requests: int


@dataclass
class RawRun:
    concurrency: int
    seconds: float
    server: Counters
    requests_done: int

    def __add__(self, other: RawRun) -> RawRun:
        return RawRun(
            self.concurrency,
            self.seconds + other.seconds,
            add_counters(self.server, other.server),
            self.requests_done + other.requests_done,
        )

    @property
    def tokens_per_s(self) -> float | None:
        return ratio(self.server.generation_tokens, self.seconds)


@dataclass
class NChoiceRun:
    label: str
    wall_s: float
    server: Counters
