"""The pre-registered hypotheses a trace report decides, one registry entry per
pre-registration (results/prereg-*.md): each names its hypotheses' rules and tests, and
`mur report --prereg NAME` picks one (the live folders it reads come with `--live NAME=DIR`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from mur.evals.report import stats
from mur.evals.report.live import LiveArm, LiveRow, paired_difference
from mur.evals.report.traces import PRIMARY_SIGNAL, Auroc, Question, RuleResult

ECONOMY_MARGIN = -0.02
"""An economy rule may lose at most this accuracy: its interval's lower bound lies above it."""


@dataclass(frozen=True)
class Decision:
    """One hypothesis: its measured value, interval, and whether the registered test holds
    (None: not decided yet, its folder is missing)."""

    name: str
    claim: str
    value: float
    interval: stats.Interval | None
    supported: bool | None
    detail: str = ""
    unit: Literal["points", "auroc"] = "points"


@dataclass(frozen=True)
class Evidence:
    """What a pre-registration's tests read: the recorded questions, the replayed rules by
    name, the AUROCs, and the live arms by name with their rows against majority@K."""

    questions: Sequence[Question]
    k: int
    rules: Mapping[str, RuleResult]
    aurocs: Sequence[Auroc]
    arms: Mapping[str, LiveArm]
    rows: Mapping[str, LiveRow]
    resamples: int
    seed: int

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
    arms: tuple[str, ...] = ()
    """The live folders its hypotheses read (`--live NAME=DIR`)."""


def _replication(e: Evidence, name: str) -> Decision:
    majority = e.rules["majority"]
    gains = [
        float(majority.per_question[q.problem_id].correct) - q.single_accuracy for q in e.questions
    ]
    interval = stats.bootstrap_interval(gains, resamples=e.resamples, seed=e.seed)
    return Decision(
        name,
        f"parallel scaling pays: majority@{e.k} - single-trace accuracy > 0",
        sum(gains) / len(gains),
        interval,
        bool(interval is not None and interval.low > 0),
    )


def _economy(e: Evidence, name: str, rule: str, ratio_at_most: float) -> Decision:
    esc, majority = e.rules[rule], e.rules["majority"]
    diff, interval = e.paired(esc, majority)
    ratio = esc.tokens_per_question / majority.tokens_per_question
    return Decision(
        name,
        f"economy: {rule} - majority@{e.k}, lower bound > -2 points, at <= {ratio_at_most}x "
        "the tokens",
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


def _pending(name: str, claim: str, arm: str) -> Decision:
    return Decision(name, claim, float("nan"), None, None, f"not decided: no live folder {arm!r}")


def branching_fresh(e: Evidence) -> list[Decision]:
    """H8-H11 of results/prereg-branching-fresh.md."""
    decisions = [_replication(e, "H8"), _economy(e, "H9", "mur-esc", 0.7)]
    claim = (
        f"branching economy: MUR branching - majority@{e.k}, lower bound > -2 points, at "
        "<= 0.5x the tokens"
    )
    if (row := e.rows.get("mur")) is None:
        decisions.append(_pending("H10", claim, "mur"))
    else:
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
    if "mur" not in e.arms or "random" not in e.arms:
        decisions.append(_pending("H11", claim, "random" if "mur" in e.arms else "mur"))
    else:
        diff, interval, count = paired_difference(
            e.arms["mur"], e.arms["random"], resamples=e.resamples, seed=e.seed
        )
        branched = {n: e.rows[n].branched_per_question for n in ("mur", "random")}
        decisions.append(
            Decision(
                "H11",
                claim,
                diff,
                interval,
                bool(interval is not None and interval.low > 0),
                f"{count} questions; branches a question: MUR {branched['mur']:.2f}, random "
                f"{branched['random']:.2f}",
            )
        )
    return decisions


PREREGS: dict[str, Prereg] = {
    prereg.name: prereg
    for prereg in (
        Prereg("parallel-traces", "results/prereg-parallel-traces.md", parallel_traces),
        Prereg(
            "branching-fresh",
            "results/prereg-branching-fresh.md",
            branching_fresh,
            arms=("mur", "random", "eager"),
        ),
    )
}
