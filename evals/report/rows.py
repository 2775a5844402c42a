"""The report's result types: one row per setting, and the run's busy wall clock. Kept apart
from the code that computes them (evals.report.tables) and the code that shows them
(markdown, plots), which both read them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from mur.evals.report.pairing import AVERAGE


@dataclass(frozen=True, kw_only=True)
class Row:
    """One setting's numbers. Accuracies are fractions in [0, 1]; tokens and steps are per
    question (each question's mean over its samples, then the mean over questions); the
    `*_vs_always` / paired fields are on the questions this setting and always both ran, and
    None when the table has no always rows (or this is an average row)."""

    dataset: str
    strategy: str
    gate: str
    gamma: float | None
    questions: int
    runs: int
    accuracy: float
    accuracy_low: float | None = None
    accuracy_high: float | None = None
    paired_questions: int | None = None
    accuracy_diff: float | None = None
    accuracy_diff_low: float | None = None
    accuracy_diff_high: float | None = None
    better: int | None = None
    worse: int | None = None
    p_value: float | None = None
    backbone_tokens: float
    external_tokens: float
    total_tokens: float
    tokens_vs_always: float | None = None
    steps_total: float
    steps_scaled: float
    scaled_share: float
    wall_mean: float
    wall_p50: float
    wall_p95: float


@dataclass(frozen=True)
class RunTime:
    """How long the recorded runs kept the server busy, across resumed sessions."""

    timed_runs: int  # runs with a finished_at stamp (records written before it have none)
    runs: int
    busy_s: float  # the union of the timed runs' [finished_at - latency_s, finished_at]


def sections(rows: Sequence[Row]) -> dict[tuple[str, str], list[Row]]:
    """The rows of each dataset and strategy, in the order they come (average rows apart): a
    table in report.md, a panel in its plot."""
    found: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.dataset != AVERAGE:
            found[(row.dataset, row.strategy)].append(row)
    return found
