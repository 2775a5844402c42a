"""Several independent traces of a question, and MUR's signals and stops across them
(results/prereg-parallel-traces.md, H4-H7): does a vote of K traces pay, does MUR's final
momentum rank traces, does mur-esc keep the vote's accuracy at half its tokens, does a
momentum-weighted vote beat the plain one?

    mur report results/math500-traces-1.5b --prereg parallel-traces

Its rules (`RULES`) are replayed on the recorded traces beside majority@K; the other experiment
on recorded traces replays the same ones.
"""

from __future__ import annotations

from typing import Any

from mur.evals.report import stats
from mur.evals.report.experiment import Decision, Evidence, Experiment, Rule, pending
from mur.evals.report.traces import PRIMARY_SIGNAL

ECONOMY_MARGIN = -0.02
"""An economy rule may lose at most this accuracy: its interval's lower bound lies above it."""

MUR_ESC: dict[str, Any] = {
    "traces": 8,
    "trace_batch": 2,
    "settle": "agree",
    "trace_stop": "momentum",
    "stop_keep": 1.0,
}
"""MUR's adaptive trace rule, mur-esc (H6), as Context settings: traces two at a time, at most
8, until a pair agrees; a trace after the first two stops once its momentum exceeds theirs."""


ESC = {name: value for name, value in MUR_ESC.items() if name != "traces"}
ADAPTIVE = {"trace_batch": 2}
ONLINE = {**ADAPTIVE, "vote": "confidence", "settle": "consensus", "trace_stop": "confidence"}
RULES: dict[str, Rule] = {
    "momentum-vote": Rule("momentum vote (MUR)", {"vote": "momentum"}),
    "deepconf-offline-90": Rule(
        "DeepConf offline, top 90%", {"vote": "confidence", "vote_keep": 0.9}
    ),
    "deepconf-offline-10": Rule(
        "DeepConf offline, top 10%", {"vote": "confidence", "vote_keep": 0.1}
    ),
    "consensus": Rule("adaptive, consensus 0.95", {**ADAPTIVE, "settle": "consensus"}),
    "deepconf-online-90": Rule("DeepConf online, keep 90%", {**ONLINE, "stop_keep": 0.9}),
    "deepconf-online-10": Rule("DeepConf online, keep 10%", {**ONLINE, "stop_keep": 0.1}),
    "mur-esc": Rule("mur-esc", ESC),
    # mur-esc taken apart: how much of its saving is the settling, how much the stop.
    "mur-esc-settling": Rule(
        "mur-esc's settling alone (ESC, window 2)", {**ESC, "trace_stop": "none"}
    ),
    "mur-esc-stop": Rule("mur-esc's momentum stop alone", {**ESC, "settle": "never"}),
    # The statistical stops (nodes.settling): ESC's window (2 is the settling alone above),
    # the Beta stop, its_hub's doubling.
    "esc-4": Rule("ESC, window 4", {"trace_batch": 4, "settle": "agree"}),
    "beta": Rule(
        "Beta stop 0.95 (Adaptive-Consistency, its_hub)", {"trace_batch": 1, "settle": "beta"}
    ),
    "doubling": Rule(
        "its_hub doubling, share 0.75", {**ADAPTIVE, "settle": "doubling", "consensus": 0.75}
    ),
}


def replication(e: Evidence, name: str) -> Decision:
    """Parallel scaling pays: majority@K beats a single trace."""
    claim = f"parallel scaling pays: majority@{e.k} - single-trace accuracy > 0"
    if (why := e.unfinished()) is not None:
        return pending(name, claim, why)
    majority = e.rules["majority"]
    gains = [
        float(majority.per_question[q.problem_id].correct) - q.single_accuracy for q in e.questions
    ]
    interval = stats.bootstrap_interval(gains, resamples=e.resamples, seed=e.seed)
    supported = bool(interval is not None and interval.low > 0)
    return Decision(name, claim, sum(gains) / len(gains), interval, supported)


def economy(e: Evidence, name: str, rule: str, ratio_at_most: float) -> Decision:
    """`rule` keeps majority@K's accuracy (within 2 points) at `ratio_at_most` its tokens."""
    claim = (
        f"economy: {rule} - majority@{e.k}, lower bound > -2 points, at <= {ratio_at_most}x "
        "the tokens"
    )
    if (why := e.unfinished()) is not None:
        return pending(name, claim, why)
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


def decide(e: Evidence) -> list[Decision]:
    """H4-H7."""
    momentum = next(a for a in e.aurocs if a.signal == PRIMARY_SIGNAL)
    weighted_diff, weighted_interval = e.paired(e.rules["momentum-vote"], e.rules["majority"])
    return [
        replication(e, "H4"),
        Decision(
            "H5",
            "MUR's final momentum ranks traces: within-question AUROC > 0.5",
            momentum.value if momentum.value is not None else float("nan"),
            momentum.interval,
            bool(momentum.interval is not None and momentum.interval.low > 0.5),
            f"{momentum.pairs:,} pairs in {momentum.questions} questions",
            unit="auroc",
        ),
        economy(e, "H6", "mur-esc", 0.5),
        Decision(
            "H7",
            f"weighting: momentum-weighted vote - majority@{e.k} > 0",
            weighted_diff,
            weighted_interval,
            bool(weighted_interval is not None and weighted_interval.low > 0),
        ),
    ]


EXPERIMENT = Experiment(
    "parallel-traces",
    "results/prereg-parallel-traces.md",
    reads="traces",
    decide=decide,
    rules=RULES,
    questions=200,
)
