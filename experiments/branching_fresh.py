"""Branching at MUR's step, on fresh questions (results/prereg-branching-fresh.md, H8-H11):
the first experiment's replication and economy on MATH-500 questions 201-400, then live
branching arms beside the recorded traces: does branching at MUR's step keep majority@8's
accuracy at half its tokens, and does it beat branching at a random step?

    mur report results/math500-traces-1.5b-fresh --prereg branching-fresh \\
        --live mur=results/math500-branch-mur-1.5b \\
        --live random=results/math500-branch-random-1.5b \\
        --live eager=results/math500-branch-eager-1.5b
"""

from __future__ import annotations

from typing import Any

from mur.evals.report.experiment import Decision, Evidence, Experiment, pending
from mur.evals.report.traces import paired_difference
from mur.experiments import parallel_traces
from mur.experiments.parallel_traces import ECONOMY_MARGIN, MUR_ESC, economy, replication

SCHEDULE: dict[str, Any] = {**MUR_ESC, "vote": "majority", "branch_entropy": 2.0}
"""The schedule every branching arm runs: mur-esc's, with branches for its later traces
(EAGer's threshold theta = 2.0 nats)."""

MUR_BRANCH = ("mur", "mur_max")
"""MUR's branch rule: the pilot chose mur_max (it tied mur_first on accuracy and spent fewer
tokens); the runs recorded it under the name the pilot gave it, `mur`."""


def _branching_economy(e: Evidence) -> Decision:
    claim = (
        f"branching economy: MUR branching - majority@{e.k}, lower bound > -2 points, at "
        "<= 0.5x the tokens"
    )
    if (why := e.uncovered("mur")) is not None:
        return pending("H10", claim, why)
    row = e.rows["mur"]
    return Decision(
        "H10",
        claim,
        row.difference,
        row.interval,
        bool(row.interval is not None and row.interval.low > ECONOMY_MARGIN)
        and row.token_ratio <= 0.5,
        f"{row.token_ratio:.2f}x majority's tokens ({row.traces_per_question:.2f} traces, "
        f"{row.branched_per_question:.2f} branched and {row.stopped_per_question:.2f} "
        f"stopped a question; {row.questions} questions)",
    )


def _branch_point(e: Evidence) -> Decision:
    claim = "MUR picks the branch point: MUR branching - random branching > 0"
    if (why := e.uncovered("mur") or e.uncovered("random")) is not None:
        return pending("H11", claim, why)
    mur, random = e.arms["mur"], e.arms["random"]
    ids = sorted(q.problem_id for q in e.questions)
    diff, interval = paired_difference(
        mur.per_question, random.per_question, ids, resamples=e.resamples, seed=e.seed
    )
    branched = {
        arm.name: sum(arm.per_question[q].branched for q in ids) / len(ids) for arm in (mur, random)
    }
    return Decision(
        "H11",
        claim,
        diff,
        interval,
        bool(interval is not None and interval.low > 0),
        f"{len(ids)} questions; branches a question: MUR {branched['mur']:.2f}, random "
        f"{branched['random']:.2f}",
    )


def decide(e: Evidence) -> list[Decision]:
    """H8-H11."""
    return [
        replication(e, "H8"),
        economy(e, "H9", "mur-esc", 0.7),
        _branching_economy(e),
        _branch_point(e),
    ]


EXPERIMENT = Experiment(
    "branching-fresh",
    "results/prereg-branching-fresh.md",
    reads="traces",
    decide=decide,
    rules=parallel_traces.RULES,
    questions=200,
    arms={
        "mur": {**SCHEDULE, "branch": MUR_BRANCH},
        "random": {**SCHEDULE, "branch": "random"},
        "eager": {**SCHEDULE, "branch": "eager"},
    },
)
