"""The pre-registered hypotheses a trace report decides, one registry entry per
pre-registration (results/prereg-*.md): each names its hypotheses' rules and tests, and
`mur report --prereg NAME` picks one (the live folders it reads come with `--live NAME=DIR`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mur.evals.report import stats
from mur.evals.report.live import LiveArm, LiveRow, first_ids, paired_difference
from mur.evals.report.traces import PRIMARY_SIGNAL, Auroc, Question, RuleResult
from mur.graphs.traces import MUR_ESC
from mur.nodes.branching import MUR_RULE

ECONOMY_MARGIN = -0.02
"""An economy rule may lose at most this accuracy: its interval's lower bound lies above it."""


@dataclass(frozen=True)
class Decision:
    """One hypothesis: its measured value, interval, and whether the registered test holds
    (None: not decided yet, a folder it reads is missing or not complete)."""

    name: str
    claim: str
    value: float
    interval: stats.Interval | None
    supported: bool | None
    detail: str = ""
    unit: Literal["points", "auroc"] = "points"


def still_recording(recorded: int, planned: int | None) -> bool:
    """Whether a traces folder with `recorded` questions is short of the `planned` ones (None:
    whatever it holds is the plan)."""
    return planned is not None and recorded < planned


@dataclass(frozen=True)
class Evidence:
    """What a pre-registration's tests read: the recorded questions (those with all their
    traces) and how many the folder has any trace of, the replayed rules by name, the AUROCs,
    and the live arms by name (on the complete questions) with their rows against majority@K."""

    questions: Sequence[Question]
    recorded: int
    k: int
    rules: Mapping[str, RuleResult]
    aurocs: Sequence[Auroc]
    arms: Mapping[str, LiveArm]
    rows: Mapping[str, LiveRow]
    resamples: int
    seed: int
    planned: int | None = None
    """The questions the pre-registration decides on (None: whatever the folder holds)."""

    def unfinished(self) -> str | None:
        """Why the recorded folder cannot decide yet (its run has not reached every planned
        question), or None."""
        if not still_recording(self.recorded, self.planned):
            return None
        return (
            f"pending: {self.recorded} of {self.planned} questions recorded "
            f"({len(self.questions)} with all {self.k} traces)"
        )

    def uncovered(self, arm: str) -> str | None:
        """Why live arm `arm` cannot decide yet (absent, or short of a complete recorded
        question), or None."""
        if arm not in self.arms:
            return f"not decided: no live folder {arm!r}"
        ran = self.arms[arm].per_question
        missing = [q.problem_id for q in self.questions if q.problem_id not in ran]
        if missing:
            return (
                f"pending: live folder {arm!r} has {len(self.questions) - len(missing)} of "
                f"{len(self.questions)} questions (missing {first_ids(missing)})"
            )
        return self.unfinished()

    def paired(self, a: RuleResult, b: RuleResult) -> tuple[float, stats.Interval | None]:
        ids = sorted(a.per_question)
        diffs = [float(a.per_question[q].correct) - float(b.per_question[q].correct) for q in ids]
        interval = stats.bootstrap_interval(diffs, resamples=self.resamples, seed=self.seed)
        return float(sum(diffs) / len(diffs)), interval


@dataclass(frozen=True)
class Prereg:
    name: str
    document: str
    decide: Callable[[Evidence], list[Decision]]
    questions: int | None = None
    """The questions it decides on: a folder short of them leaves its hypotheses pending."""
    arms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The live folders its hypotheses read (`--live NAME=DIR`), each with the trace settings
    it must have been run with (a value, or a tuple of the values allowed)."""

    def check_arm(self, arm: LiveArm) -> None:
        """A live folder given under one of this pre-registration's arm names must have been
        run with that arm's settings: two folders swapped would decide the wrong test."""
        for name, wanted in self.arms.get(arm.name, {}).items():
            allowed = wanted if isinstance(wanted, tuple) else (wanted,)
            if arm.per_question and arm.config.get(name) not in allowed:
                raise ValueError(
                    f"the live folder {arm.folder} ran {name}={arm.config.get(name)!r}; "
                    f"{self.document}'s arm {arm.name!r} runs {name}="
                    f"{' or '.join(map(repr, allowed))}: check which folder goes with which "
                    "--live name"
                )


def _replication(e: Evidence, name: str) -> Decision:
    claim = f"parallel scaling pays: majority@{e.k} - single-trace accuracy > 0"
    if (why := e.unfinished()) is not None:
        return _pending(name, claim, why)
    majority = e.rules["majority"]
    gains = [
        float(majority.per_question[q.problem_id].correct) - q.single_accuracy for q in e.questions
    ]
    interval = stats.bootstrap_interval(gains, resamples=e.resamples, seed=e.seed)
    return Decision(
        name,
        claim,
        sum(gains) / len(gains),
        interval,
        bool(interval is not None and interval.low > 0),
    )


def _economy(e: Evidence, name: str, rule: str, ratio_at_most: float) -> Decision:
    claim = (
        f"economy: {rule} - majority@{e.k}, lower bound > -2 points, at <= {ratio_at_most}x "
        "the tokens"
    )
    if (why := e.unfinished()) is not None:
        return _pending(name, claim, why)
    esc, majority = e.rules[rule], e.rules["majority"]
    diff, interval = e.paired(esc, majority)
    ratio = esc.tokens_per_question / majority.tokens_per_question
    return Decision(
        name,
        claim,
        diff,
        interval,
        bool(interval is not None and interval.low > ECONOMY_MARGIN and ratio <= ratio_at_most),
        f"{ratio:.2f}x majority's tokens ({esc.traces_per_question:.2f} traces and "
        f"{esc.stopped_per_question:.2f} stopped a question)",
    )


def parallel_traces(e: Evidence) -> list[Decision]:
    """H4-H7 of results/prereg-parallel-traces.md."""
    momentum = next(a for a in e.aurocs if a.signal == PRIMARY_SIGNAL)
    weighted_diff, weighted_interval = e.paired(e.rules["momentum vote (MUR)"], e.rules["majority"])
    return [
        _replication(e, "H4"),
        Decision(
            "H5",
            "MUR's final momentum ranks traces: within-question AUROC > 0.5",
            momentum.value if momentum.value is not None else float("nan"),
            momentum.interval,
            bool(momentum.interval is not None and momentum.interval.low > 0.5),
            f"{momentum.pairs:,} pairs in {momentum.questions} questions",
            unit="auroc",
        ),
        _economy(e, "H6", "mur-esc", 0.5),
        Decision(
            "H7",
            f"weighting: momentum-weighted vote - majority@{e.k} > 0",
            weighted_diff,
            weighted_interval,
            bool(weighted_interval is not None and weighted_interval.low > 0),
        ),
    ]


def _pending(name: str, claim: str, why: str) -> Decision:
    return Decision(name, claim, float("nan"), None, None, why)


def branching_fresh(e: Evidence) -> list[Decision]:
    """H8-H11 of results/prereg-branching-fresh.md."""
    decisions = [_replication(e, "H8"), _economy(e, "H9", "mur-esc", 0.7)]
    claim = (
        f"branching economy: MUR branching - majority@{e.k}, lower bound > -2 points, at "
        "<= 0.5x the tokens"
    )
    if (why := e.uncovered("mur")) is not None:
        decisions.append(_pending("H10", claim, why))
    else:
        row = e.rows["mur"]
        decisions.append(
            Decision(
                "H10",
                claim,
                row.difference,
                row.interval,
                bool(
                    row.interval is not None
                    and row.interval.low > ECONOMY_MARGIN
                    and row.token_ratio <= 0.5
                ),
                f"{row.token_ratio:.2f}x majority's tokens ({row.traces_per_question:.2f} traces, "
                f"{row.branched_per_question:.2f} branched and {row.stopped_per_question:.2f} "
                f"stopped a question; {row.questions} questions)",
            )
        )
    claim = "MUR picks the branch point: MUR branching - random branching > 0"
    if (why := e.uncovered("mur") or e.uncovered("random")) is not None:
        decisions.append(_pending("H11", claim, why))
    else:
        mur, random = e.arms["mur"], e.arms["random"]
        ids = sorted(q.problem_id for q in e.questions)
        diff, interval = paired_difference(mur, random, ids, resamples=e.resamples, seed=e.seed)
        branched = {
            arm.name: sum(arm.per_question[q].branched for q in ids) / len(ids)
            for arm in (mur, random)
        }
        decisions.append(
            Decision(
                "H11",
                claim,
                diff,
                interval,
                bool(interval is not None and interval.low > 0),
                f"{len(ids)} questions; branches a question: MUR {branched['mur']:.2f}, random "
                f"{branched['random']:.2f}",
            )
        )
    return decisions


BRANCHING_SCHEDULE: dict[str, Any] = {**MUR_ESC, "vote": "majority", "branch_entropy": 2.0}
"""The schedule every branching arm of results/prereg-branching-fresh.md runs: mur-esc's, with
branches for its later traces (EAGer's threshold theta = 2.0 nats)."""


PREREGS: dict[str, Prereg] = {
    prereg.name: prereg
    for prereg in (
        Prereg(
            "parallel-traces",
            "results/prereg-parallel-traces.md",
            parallel_traces,
            questions=200,
        ),
        Prereg(
            "branching-fresh",
            "results/prereg-branching-fresh.md",
            branching_fresh,
            questions=200,
            arms={
                "mur": {**BRANCHING_SCHEDULE, "branch": (MUR_RULE, "mur_max")},
                "random": {**BRANCHING_SCHEDULE, "branch": "random"},
                "eager": {**BRANCHING_SCHEDULE, "branch": "eager"},
            },
        ),
    )
}
