"""The online check of results/prereg-parallel-traces.md: a trace rule run live on some of
the recorded questions should land where replaying it on their recorded traces predicts.

    mur report results/math500-traces-1.5b-online --predicted-by results/math500-traces-1.5b

The prediction replays the live run's rule (its Context, from its records) on 2,000 random
orders of each question's recorded traces; the check passes when the live accuracy and tokens a
question both fall inside the 2.5-97.5th percentiles of the replays.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mur.evals.harness.records import load_records
from mur.evals.harness.run_record import RunRecord, total_tokens
from mur.evals.report import stats
from mur.evals.report.tables import Appendix
from mur.evals.report.traces import (
    Question,
    first_ids,
    per_question_means,
    question_traces,
    recorded_context,
    replay,
)
from mur.nodes.voting import TraceRules


@dataclass(frozen=True)
class Prediction:
    """Where a live run of a rule should land: the 2.5-97.5th percentiles, over replays, of
    its accuracy and its tokens, traces drawn and traces stopped a question."""

    accuracy: stats.Interval
    tokens: stats.Interval
    traces: stats.Interval
    stopped: stats.Interval


def prediction_interval(
    questions: Sequence[Question], rules: TraceRules, *, replays: int = 2000, seed: int = 0
) -> Prediction:
    """What a live run of `rules` on these questions should land in, over `replays` random
    orders of each question's recorded traces."""
    rng = np.random.default_rng(seed)
    means: list[tuple[float, ...]] = []  # accuracy, tokens, traces drawn, stopped
    for _ in range(replays):
        results = [
            replay(q, rules, order=rng.permutation(len(q.traces)).tolist()) for q in questions
        ]
        means.append(tuple(per_question_means(results).values()))
    low, high = np.percentile(np.array(means), [2.5, 97.5], axis=0)
    return Prediction(*(stats.Interval(float(a), float(b)) for a, b in zip(low, high, strict=True)))


@dataclass(frozen=True)
class OnlineCheck:
    """A live run of a trace rule against what replaying it on recorded traces predicts. It
    passes on accuracy and tokens (the pre-registered check); traces drawn and stopped are
    shown beside them."""

    questions: int
    accuracy: float
    tokens_per_question: float
    traces_per_question: float
    stopped_per_question: float
    predicted: Prediction

    @property
    def passes(self) -> bool:
        inside = lambda value, span: span.low <= value <= span.high  # noqa: E731
        return inside(self.accuracy, self.predicted.accuracy) and inside(
            self.tokens_per_question, self.predicted.tokens
        )


def online_check(recorded: Sequence[RunRecord], live: Sequence[RunRecord]) -> OnlineCheck:
    """`live`: one run per question of a trace rule (its Context in the records); `recorded`:
    the same questions' independent traces. The prediction replays the live run's rule on
    random orders of the recorded traces (`prediction_interval`)."""
    if not live:
        raise ValueError("the live folder has no records")
    configs = {json.dumps(r["trace"]["config"], sort_keys=True) for r in live}
    if len(configs) != 1:
        raise ValueError(f"the live folder mixes {len(configs)} settings: check one rule")
    rules = recorded_context(live[0]["trace"]["config"])
    questions, _ = question_traces(recorded)
    by_id = {q.problem_id: q for q in questions}
    missing = sorted({r["problem_id"] for r in live} - by_id.keys())
    if missing:
        raise ValueError(
            f"no recorded traces for {len(missing)} live questions: {first_ids(missing)}"
        )
    subset = [by_id[r["problem_id"]] for r in live]
    summaries = [r["trace"]["traces"] for r in live]
    return OnlineCheck(
        questions=len(live),
        accuracy=sum(r["correct"] for r in live) / len(live),
        tokens_per_question=sum(total_tokens(r) for r in live) / len(live),
        traces_per_question=sum(len(s) for s in summaries) / len(live),
        stopped_per_question=sum(t["stopped"] for s in summaries for t in s) / len(live),
        predicted=prediction_interval(subset, rules.trace_rules()),
    )


def online_markdown(check: OnlineCheck, recorded: str) -> str:
    verdict = "passes" if check.passes else "fails"
    p = check.predicted

    def row(name: str, live: str, span: stats.Interval, fmt: str) -> str:
        return f"| {name} | {live} | [{span.low:{fmt}}, {span.high:{fmt}}] |\n"

    return (
        f"## Online check against `{recorded}`: {verdict}\n\n"
        "It passes when the live accuracy and tokens a question both fall inside the "
        "predicted intervals; traces drawn and stopped are shown beside them.\n\n"
        "| | live | predicted (2.5-97.5th percentile of 2,000 replays) |\n|---|---|---|\n"
        + row(f"accuracy ({check.questions} questions)", f"{check.accuracy:.1%}", p.accuracy, ".1%")
        + row("tokens / question", f"{check.tokens_per_question:,.0f}", p.tokens, ",.0f")
        + row("traces / question", f"{check.traces_per_question:.2f}", p.traces, ".2f")
        + row("stopped / question", f"{check.stopped_per_question:.2f}", p.stopped, ".2f")
    )


def against(predicted_by: Path) -> Appendix:
    """The check of a report's records (a live run) against the recorded traces in
    `predicted_by`, as a section of the report (`write_report(appendices=...)`)."""

    def section(live: Sequence[RunRecord]) -> tuple[str, str, dict[str, Any]]:
        check = online_check(load_records(predicted_by), live)
        entry = {"predicted_by": str(predicted_by), "passes": check.passes, **asdict(check)}
        return online_markdown(check, str(predicted_by)), "online_check", entry

    return section
