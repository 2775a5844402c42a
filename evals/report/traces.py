"""Trace rules judged per question, from the records of several traces of each question.

Recorded traces (a folder of one setting's samples): accuracy against k, how well each trace
signal ranks traces (within-question AUROC), and every trace rule replayed with the very
functions a live run calls (nodes.voting, nodes.settling, nodes.trace_stop, graphs.traces,
graphs.loop.stops_after). Traces are independent samples, so a rule replayed on them in sample
order is what a live run would have done on those draws.

Live arms (`mur solve --traces ...`, one run a question): a rule that branches cannot be
replayed on independent traces (a branch's steps after the branch point were never drawn), so
it runs live and is judged against majority@K of the recorded traces, paired per question.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mur.evals.harness.records import records_so_far
from mur.evals.harness.run_record import RunRecord, setting_of, total_tokens
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


def settings_in(records: Sequence[RunRecord]) -> set[str]:
    """The settings (`setting_of`) the records ran: a folder of traces holds one."""
    return {setting_of(r["strategy"], r["gate"], r["gamma"]) for r in records}


def has_traces(records: Sequence[RunRecord]) -> bool:
    """Several samples of one setting: independent traces, analysed as such (trace_report)."""
    return len(settings_in(records)) == 1 and any(r["sample"] > 0 for r in records)


def first_ids(ids: Sequence[str], shown: int = 5) -> str:
    """Up to `shown` question ids and how many more: how a message names the questions at fault."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


# ---------------------------------------------------------------------------- recorded traces


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


def question_traces(records: Sequence[RunRecord]) -> tuple[list[Question], list[str]]:
    """The questions of one setting with all their traces (as many as any question has), and
    the ids left out because a sample is missing."""
    if len(settings := settings_in(records)) != 1:
        raise ValueError(
            f"a trace analysis reads one setting's samples, got {len(settings)}: "
            f"{', '.join(sorted(settings))}"
        )
    by_question: dict[str, dict[int, RunRecord]] = defaultdict(dict)
    for record in records:
        by_question[record["problem_id"]][record["sample"]] = record
    wanted = max(len(runs) for runs in by_question.values())
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


def per_question_means(results: Sequence[Replayed]) -> dict[str, float]:
    """Accuracy, tokens, traces drawn and stopped, each a mean over questions: the columns a
    replayed rule and a live arm share."""
    return {
        "accuracy": stats.mean([r.correct for r in results]),
        "tokens_per_question": stats.mean([r.tokens for r in results]),
        "traces_per_question": stats.mean([r.drawn for r in results]),
        "stopped_per_question": stats.mean([r.stopped for r in results]),
    }


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
    return RuleResult(name, **per_question_means(list(results.values())), per_question=results)


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


# ---------------------------------------------------------------------------- live arms


@dataclass(frozen=True)
class LiveQuestion(Replayed):
    """One question solved live: what a replayed rule shows (right or not, completion tokens,
    traces drawn and stopped part-way), and what only a live run has: its prompt tokens, the
    traces branched off another, and the branch points its warm-ups offered."""

    prompt_tokens: int
    branched: int
    parents: int
    """The first batch's traces (the warm-ups a branch may start from)."""
    parents_with_points: int | None
    """Of those, how many offered the branch rule a point (EAGer's: a token over its entropy
    threshold); None where the records do not say (written before `branch_points` was)."""


@dataclass(frozen=True)
class LiveArm:
    """A live folder under a name (`mur`, `random`, ...): its rule and its questions."""

    name: str
    folder: str
    rule: str
    """The trace settings that differ from one plain trace (the folder's Context)."""
    per_question: Mapping[str, LiveQuestion]
    config: Mapping[str, Any]
    """Its trace settings (TRACE_FIELDS), as its records' Context has them."""


TRACE_FIELDS = (
    "traces",
    "trace_batch",
    "branch",
    "branch_entropy",
    "settle",
    "trace_stop",
    "stop_keep",
    "vote",
)


def load_arm(name: str, folder: str | Path) -> LiveArm:
    """The live folder's one run per question (its first sample), with its rule; a folder
    the run has not written into yet is an arm without questions (its hypotheses wait)."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"the live folder {folder} ({name}) does not exist")
    records = records_so_far(folder)
    configs = {tuple((f, r["trace"]["config"].get(f)) for f in TRACE_FIELDS) for r in records}
    if len(settings_in(records)) > 1 or len(configs) > 1:
        raise ValueError(f"the live folder {folder} mixes settings: compare one rule at a time")
    config = dict(next(iter(configs), ()))
    first = config.get("trace_batch") or 1
    per_question = {r["problem_id"]: _live(r, first) for r in records if r["sample"] == 0}
    rule = ", ".join(f"{field} {value}" for field, value in config.items() if value is not None)
    return LiveArm(name, str(folder), rule or "no records yet", per_question, config)


def _live(record: RunRecord, first_batch: int) -> LiveQuestion:
    summaries = record["trace"].get("traces") or []
    usage = record["usage"]
    warmups = [s for s in summaries if s["index"] < first_batch]
    points = [s.get("branch_points") for s in warmups]
    return LiveQuestion(
        correct=bool(record["correct"]),
        tokens=total_tokens(record),
        prompt_tokens=usage.get("backbone_prompt_tokens", 0)
        + usage.get("external_prompt_tokens", 0),
        drawn=len(summaries),
        branched=sum(1 for s in summaries if s.get("parent") is not None),
        stopped=sum(1 for s in summaries if s["stopped"]),
        parents=len(warmups),
        parents_with_points=None if None in points else sum(1 for n in points if n),
    )


def restricted(
    arm: LiveArm,
    complete: Collection[str],
    incomplete: Collection[str],
    *,
    recording: bool = False,
) -> tuple[LiveArm, list[str], list[str]]:
    """`arm` on the questions whose recorded traces are complete; the ids it ran whose
    recorded traces are incomplete (the pre-registered exclusion), and those the recorded
    folder has none of yet. While that folder is `recording` (short of its planned questions)
    the latter wait; once it is not, a live question it never ran is an error (the wrong
    folders paired): say which."""
    unknown = sorted(set(arm.per_question) - set(complete) - set(incomplete))
    if unknown and not recording:
        raise ValueError(
            f"{len(unknown)} questions of {arm.folder} have no recorded traces to compare "
            f"with: {first_ids(unknown)}"
        )
    left_out = sorted(set(arm.per_question) & set(incomplete))
    kept = {q: v for q, v in arm.per_question.items() if q in complete}
    return replace(arm, per_question=kept), left_out, unknown


@dataclass(frozen=True)
class LiveRow:
    """A live arm against majority@K of the recorded traces on the questions both have."""

    name: str
    folder: str
    rule: str
    questions: int
    accuracy: float
    tokens_per_question: float
    prompt_tokens_per_question: float
    traces_per_question: float
    branched_per_question: float
    stopped_per_question: float
    majority_accuracy: float
    difference: float
    """Accuracy (live - majority@K) in points of 1, paired per question."""
    interval: stats.Interval | None
    token_ratio: float
    """The live arm's completion tokens over majority@K's, summed over the same questions."""
    parents: int
    parents_with_points: int | None
    """Warm-ups, and those offering the branch rule a point, over its questions (None: not
    recorded)."""
    branch: str | None = None
    """Its branch rule's registry name (nodes/branching.py), None where it draws no branch."""
    left_out: tuple[str, ...] = ()
    """Questions it ran whose recorded traces are incomplete (not compared)."""
    unrecorded: int = 0
    """Questions it ran that the recorded folder has no trace of yet (not compared)."""


def compare_live(
    arm: LiveArm,
    majority: Mapping[str, Replayed],
    *,
    left_out: Sequence[str] = (),
    unrecorded: int = 0,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> LiveRow:
    """`arm` (`restricted` to the recorded questions) against majority@K (`majority`: the
    replayed vote per recorded question) on the questions it ran; `left_out` is named beside."""
    if not arm.per_question:
        raise ValueError(f"the live folder {arm.folder} has no question to compare yet")
    if missing := sorted(set(arm.per_question) - set(majority)):
        raise ValueError(f"{len(missing)} questions of {arm.folder} have no majority vote")
    ids = sorted(arm.per_question)
    live = [arm.per_question[q] for q in ids]
    difference, interval = paired_difference(
        arm.per_question, majority, ids, resamples=resamples, seed=seed
    )
    return LiveRow(
        name=arm.name,
        folder=arm.folder,
        rule=arm.rule,
        questions=len(ids),
        **per_question_means(live),
        prompt_tokens_per_question=stats.mean([q.prompt_tokens for q in live]),
        branched_per_question=stats.mean([q.branched for q in live]),
        majority_accuracy=stats.mean([majority[q].correct for q in ids]),
        difference=difference,
        interval=interval,
        token_ratio=sum(q.tokens for q in live) / sum(majority[q].tokens for q in ids),
        parents=sum(q.parents for q in live),
        parents_with_points=(
            None
            if any(q.parents_with_points is None for q in live)
            else sum(q.parents_with_points or 0 for q in live)
        ),
        branch=arm.config.get("branch"),
        left_out=tuple(left_out),
        unrecorded=unrecorded,
    )


class Graded(Protocol):
    @property
    def correct(self) -> bool: ...


def paired_difference(
    a: Mapping[str, Graded],
    b: Mapping[str, Graded],
    ids: Sequence[str],
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> tuple[float, stats.Interval | None]:
    """Accuracy a - b on questions `ids` (both graded each), paired per question, with its
    bootstrap interval: live arms against each other or against majority@K, replayed rules."""
    if not ids:
        raise ValueError("no question in common to pair")
    diffs = [float(a[q].correct) - float(b[q].correct) for q in ids]
    return stats.mean(diffs), stats.bootstrap_interval(diffs, resamples=resamples, seed=seed)
