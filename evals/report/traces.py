"""Several independent traces of one question, analysed from the records: accuracy against k,
how well each trace signal ranks traces (within-question AUROC), and every trace rule (votes,
settle rules, stop rules) replayed on the recorded traces with the very functions a live run
calls (nodes.voting, nodes.settling, nodes.trace_stop, graphs.traces, graphs.loop.stops_after).
Traces are independent samples, so a rule replayed on them in sample order is what a live run
would have done on those draws.

Which rules are replayed is an experiment's choice (experiments/, e.g. parallel_traces.RULES).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mur.evals.harness.run_record import RunRecord, setting_of
from mur.evals.report import stats
from mur.graphs.loop import stops_after, trace_confidences
from mur.graphs.records import StepRecord, TraceSummary
from mur.graphs.state import Context
from mur.graphs.traces import outcome_of, summarize_trace
from mur.nodes.confidence import first_breach
from mur.nodes.settling import next_batch
from mur.nodes.trace_stop import STOP_RULES, stop_threshold
from mur.nodes.voting import TraceOutcome, TraceRules, answer_key, tally

ENDING_REASONS = frozenset({"answer", "end_of_sequence", "context_length"})
"""A trace whose last step ended it this way was not checked after that step (it was done)."""


@dataclass(frozen=True)
class RecordedTrace:
    """One recorded trace: its sample, grade, steps and what the rules read of it."""

    sample: int
    correct: bool
    summary: TraceSummary
    steps: tuple[StepRecord, ...]

    @property
    def outcome(self) -> TraceOutcome:
        return outcome_of(self.summary)


@dataclass(frozen=True)
class Question:
    problem_id: str
    traces: tuple[RecordedTrace, ...]  # in sample order

    def correct_answer(self, answer: str | None) -> bool:
        """Whether `answer` is right: the grade of the first trace that gave it."""
        key = answer_key(answer)
        if not key:
            return False
        return next(t.correct for t in self.traces if answer_key(t.summary["answer"]) == key)

    @property
    def single_accuracy(self) -> float:
        return float(np.mean([t.correct for t in self.traces]))


def question_traces(
    records: Sequence[RunRecord], samples: int | None = None
) -> tuple[list[Question], list[str]]:
    """The questions of one setting with all their traces, and the ids left out because a
    sample is missing. `samples`: the traces a question needs (default: the most any has)."""
    settings = {setting_of(r["strategy"], r["gate"], r["gamma"]) for r in records}
    if len(settings) != 1:
        raise ValueError(
            f"a trace analysis reads one setting's samples, got {len(settings)}: "
            f"{', '.join(sorted(settings))}"
        )
    by_question: dict[str, dict[int, RunRecord]] = defaultdict(dict)
    for record in records:
        by_question[record["problem_id"]][record["sample"]] = record
    wanted = samples or max(len(runs) for runs in by_question.values())
    questions, incomplete = [], []
    for problem_id, runs in by_question.items():
        if sorted(runs) != list(range(wanted)):
            incomplete.append(problem_id)
            continue
        traces = tuple(_recorded(runs[sample]) for sample in range(wanted))
        questions.append(Question(problem_id, traces))
    return questions, incomplete


def recorded_context(config: Mapping[str, Any]) -> Context:
    """The Context a recorded run used, from its output's `config` (fields a later version
    dropped are left out; fields it added take their defaults)."""
    return Context(**{k: v for k, v in config.items() if k in Context.field_names()})


def _recorded(record: RunRecord) -> RecordedTrace:
    output: dict[str, Any] = dict(record["trace"])
    ctx = recorded_context(output["config"])
    return RecordedTrace(
        sample=record["sample"],
        correct=record["correct"],
        summary=summarize_trace(record["sample"], output, ctx),
        steps=tuple(output["steps"]),
    )


# ---------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class Replayed:
    """A rule's result on one question: right or not, tokens, traces drawn and stopped."""

    correct: bool
    tokens: int
    drawn: int
    stopped: int


def cut_at_stop(trace: RecordedTrace, rules: TraceRules, threshold: float | None) -> TraceOutcome:
    """The trace as the stop rule would have left it. Momentum: stopped after the first step
    at which `stops_after` holds (never after a step that ended the trace), costing its steps
    so far. Confidence: stopped at the first token whose group falls below the threshold,
    costing the tokens up to it (a live run also pays what the server made before it saw the
    stream close)."""
    outcome = trace.outcome
    if threshold is None or rules.trace_stop == "none":
        return outcome
    if STOP_RULES[rules.trace_stop].reads_confidence:  # watched token by token inside each step
        breach = first_breach(trace_confidences(trace.steps), threshold, rules.group_window)
        if breach is None:
            return outcome
        return replace(outcome, answer=None, tokens=breach + 1, stopped=True)
    last = len(trace.steps)
    for t in range(1, last + 1):
        if t == last and trace.summary["finish_reason"] in ENDING_REASONS:
            break
        if stops_after(trace.steps[:t], rules, threshold):
            spent = sum(step["num_tokens"] for step in trace.steps[:t])
            return replace(outcome, answer=None, tokens=spent, stopped=True)
    return outcome


def replay(question: Question, rules: TraceRules, order: Sequence[int] | None = None) -> Replayed:
    """Run `rules` on the question's recorded traces, drawn in `order` (default: samples)."""
    pool = [question.traces[i] for i in (order if order is not None else range(rules.traces))]
    outcomes: list[TraceOutcome] = []
    threshold: float | None = None
    while count := next_batch(outcomes, rules):
        if len(outcomes) == rules.first_batch and threshold is None:
            threshold = stop_threshold(outcomes, rules)
        batch = pool[len(outcomes) : len(outcomes) + count]
        limit = threshold if outcomes else None
        outcomes += [
            replace(cut_at_stop(trace, rules, limit), index=len(outcomes) + i)
            for i, trace in enumerate(batch)
        ]
    result = tally(outcomes, rules)
    return Replayed(
        correct=question.correct_answer(result.answer),
        tokens=sum(o.tokens for o in outcomes),
        drawn=len(outcomes),
        stopped=sum(o.stopped for o in outcomes),
    )


def majority_at(question: Question, k: int) -> float:
    """majority@k averaged over every subset of k of the question's traces."""
    rules = TraceRules(traces=k)
    n = len(question.traces)
    subsets = list(itertools.combinations(range(n), k))
    return float(np.mean([replay(question, rules, order=s).correct for s in subsets]))


# ---------------------------------------------------------------------------- signals

Signal = Callable[[RecordedTrace], float | None]
"""A trace signal oriented so that higher predicts correct (None: not measured)."""


def _negated(value: float | None) -> float | None:
    return None if value is None else -value


def _mean_uncertainty(trace: RecordedTrace) -> float | None:
    tokens = sum(s["num_tokens"] for s in trace.steps)
    if not tokens:
        return None
    return -math.fsum(s["uncertainty"] * s["num_tokens"] for s in trace.steps) / tokens


def _measure(name: str) -> Signal:
    return lambda trace: (trace.summary["confidence"] or {}).get(name)


SIGNALS: dict[str, Signal] = {
    "final momentum (lower)": lambda t: _negated(t.summary["momentum"]) if t.steps else None,
    "lowest group confidence": _measure("lowest_group"),
    "bottom-10% group confidence": _measure("bottom_10"),
    "tail confidence": _measure("tail"),
    "mean confidence": _measure("mean"),
    "mean uncertainty (lower)": _mean_uncertainty,
    "trace length (shorter)": lambda t: -float(t.summary["tokens"]),
}
PRIMARY_SIGNAL = "final momentum (lower)"


@dataclass(frozen=True)
class Auroc:
    signal: str
    value: float | None
    interval: stats.Interval | None
    pairs: int
    questions: int


def within_question_auroc(
    questions: Sequence[Question],
    signal: Signal,
    name: str,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> Auroc:
    """P(signal of a correct trace > signal of an incorrect trace of the same question),
    ties one half, pooled over questions; the interval resamples questions."""
    wins, pairs = [], []
    for question in questions:
        scored = [(signal(t), t.correct) for t in question.traces]
        right = [s for s, ok in scored if ok and s is not None]
        wrong = [s for s, ok in scored if not ok and s is not None]
        if right and wrong:
            a, b = np.array(right)[:, None], np.array(wrong)[None, :]
            wins.append(float(np.sum(a > b) + 0.5 * np.sum(a == b)))
            pairs.append(len(right) * len(wrong))
    if not pairs:
        return Auroc(name, None, None, 0, 0)
    w, p = np.array(wins), np.array(pairs, dtype=float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(p), size=(resamples, len(p)))
    boot = w[draws].sum(axis=1) / p[draws].sum(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    interval = stats.Interval(float(low), float(high))
    return Auroc(name, float(w.sum() / p.sum()), interval, int(p.sum()), len(p))


# ---------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class RuleResult:
    """A rule replayed on every question in sample order."""

    name: str
    accuracy: float
    tokens_per_question: float
    traces_per_question: float
    stopped_per_question: float
    per_question: Mapping[str, Replayed]


def run_rule(name: str, questions: Sequence[Question], rules: TraceRules) -> RuleResult:
    results = {q.problem_id: replay(q, rules) for q in questions}
    values = list(results.values())
    return RuleResult(
        name,
        accuracy=float(np.mean([r.correct for r in values])),
        tokens_per_question=float(np.mean([r.tokens for r in values])),
        traces_per_question=float(np.mean([r.drawn for r in values])),
        stopped_per_question=float(np.mean([r.stopped for r in values])),
        per_question=results,
    )
