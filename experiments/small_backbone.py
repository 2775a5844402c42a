"""The paper's claim as three pre-registered tests on a small backbone with an external judge
(results/prereg-small-backbone-external-judge.md), per strategy and pooled over strategies:

- H1, scaling pays: always > never.
- H2, economy: MUR at the headline gamma spends at most `ECONOMY_RATIO` of always's tokens, and
  the lower end of the 95% interval of MUR - always is above `ECONOMY_MARGIN`.
- H3, selection: MUR > random at MUR's measured rate, two-sided exact sign test p < `ALPHA`.

    mur report results/math500-{critic,foresight,thinking,best_of_n}-0.5b-judge-1.5b \\
        --out results/small-backbone-external-judge

Per strategy each comparison is paired by question (bootstrap interval, exact sign test =
McNemar's with one sample per question). Pooled, a question brings the pairs of every strategy
that ran it, so the interval resamples questions, each with all its pairs (a cluster
bootstrap), and the exact test counts the discordant pairs over all strategies. The pooled
numbers decide.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.experiment import Decision, Evidence, Experiment
from mur.evals.report.headlines import HEADLINE_GAMMA, matched_random_rate, matched_random_runs
from mur.evals.report.pairing import SettingKey, SettingRuns, group_settings

ECONOMY_RATIO = 0.5
ECONOMY_MARGIN = -0.05
ALPHA = 0.05
POOLED = "pooled"


@dataclass(frozen=True)
class PairSet:
    """A setting against a reference: per (strategy, question) score differences and the
    per-question tokens and wall times of both."""

    strategy: str
    questions: list[str]
    diffs: list[float]
    tokens: list[float]
    reference_tokens: list[float]
    wall: list[float]
    reference_wall: list[float]


def _pairs(strategy: str, setting: SettingRuns, reference: SettingRuns) -> PairSet:
    scores, reference_scores = setting.scores(), reference.scores()
    common = sorted(scores.keys() & reference_scores.keys())
    tokens, reference_tokens = setting.total_tokens(), reference.total_tokens()
    wall = setting.per_question(lambda r: float(r["latency_s"]))
    reference_wall = reference.per_question(lambda r: float(r["latency_s"]))
    return PairSet(
        strategy=strategy,
        questions=common,
        diffs=[scores[q] - reference_scores[q] for q in common],
        tokens=[tokens[q] for q in common],
        reference_tokens=[reference_tokens[q] for q in common],
        wall=[wall[q] for q in common],
        reference_wall=[reference_wall[q] for q in common],
    )


def cluster_interval(
    clusters: Sequence[Sequence[float]],
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> stats.Interval | None:
    """95% percentile bootstrap interval of the mean over all values, resampling whole
    clusters (a question with its pairs in every strategy); None below two clusters."""
    if len(clusters) < 2:
        return None
    sums = np.array([sum(c) for c in clusters], dtype=float)
    counts = np.array([len(c) for c in clusters], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(clusters), size=(resamples, len(clusters)))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    tail = (1 - stats.CONFIDENCE) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return stats.Interval(float(low), float(high))


COST = "cost"
CLAIMS = {
    "H1": "scaling pays",
    "H2": f"economy (<= {ECONOMY_RATIO:g}x the tokens, lower bound > "
    f"{ECONOMY_MARGIN * 100:+.0f} points)",
    "H3": f"selection (exact p < {ALPHA:g})",
    COST: "MUR's price over plain CoT",
}


def _test(
    hypothesis: str,
    comparison: str,
    scope: str,
    sets: Sequence[PairSet],
    decide: Callable[[float, stats.Interval | None, float, float], bool] | None,
    *,
    resamples: int,
    seed: int,
) -> Decision:
    diffs = [d for s in sets for d in s.diffs]
    by_question: dict[str, list[float]] = {}
    for pair_set in sets:
        for question, diff in zip(pair_set.questions, pair_set.diffs, strict=True):
            by_question.setdefault(question, []).append(diff)
    interval = cluster_interval(list(by_question.values()), resamples=resamples, seed=seed)
    better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    p_value = stats.exact_sign_test(better, worse)
    difference = stats.mean(diffs)
    tokens = sum(t for s in sets for t in s.tokens)
    reference_tokens = sum(t for s in sets for t in s.reference_tokens)
    wall = sum(w for s in sets for w in s.wall)
    reference_wall = sum(w for s in sets for w in s.reference_wall)
    tokens_ratio = tokens / reference_tokens if reference_tokens else math.nan
    wall_ratio = wall / reference_wall if reference_wall else math.nan
    return Decision(
        hypothesis,
        f"{CLAIMS[hypothesis]}: {comparison}, {scope}",
        difference,
        interval,
        decide(difference, interval, p_value, tokens_ratio) if decide else None,
        f"{len(diffs)} pairs, better / worse {better} / {worse}, exact p {p_value:.3g}; "
        f"{tokens_ratio:.2f}x the tokens, {wall_ratio:.2f}x the wall time",
        tested=decide is not None,
    )


def _scales(difference: float, interval: stats.Interval | None, *_: float) -> bool:
    return interval is not None and interval.low > 0


def _economical(_: float, interval: stats.Interval | None, __: float, ratio: float) -> bool:
    return ratio <= ECONOMY_RATIO and interval is not None and interval.low > ECONOMY_MARGIN


def _selects(difference: float, _: stats.Interval | None, p_value: float, __: float) -> bool:
    return difference > 0 and p_value < ALPHA


Rule = Callable[[float, stats.Interval | None, float, float], bool]
HYPOTHESES: tuple[tuple[str, str, Rule | None], ...] = (
    ("H1", "always - never", _scales),
    ("H2", "mur - always", _economical),
    ("H3", "mur - random at MUR's rate", _selects),
    (COST, "mur - never", None),  # MUR's price over plain CoT: reported, not tested
)


def _comparisons(
    settings: dict[SettingKey, SettingRuns], dataset: str, strategy: str, gamma: float
) -> dict[str, PairSet]:
    """This strategy's three comparisons (those whose settings it has)."""

    def find(gate: str, want_gamma: float | None = None) -> SettingRuns | None:
        for (d, s, g, setting_gamma), runs in settings.items():
            if (d, s, g) != (dataset, strategy, gate):
                continue
            if want_gamma is None or (
                setting_gamma is not None and math.isclose(setting_gamma, want_gamma)
            ):
                return runs
        return None

    never, always, mur = find("never"), find("always"), find("mur", gamma)
    found: dict[str, PairSet] = {}
    if always is not None and never is not None:
        found["H1"] = _pairs(strategy, always, never)
    if mur is not None and always is not None:
        found["H2"] = _pairs(strategy, mur, always)
    if mur is not None and never is not None:
        found[COST] = _pairs(strategy, mur, never)
    if mur is not None:
        rate = matched_random_rate(mur.records)
        matched = matched_random_runs(settings, (dataset, strategy), rate)
        if matched is not None:
            found["H3"] = _pairs(strategy, mur, matched[1])
    return found


def hypothesis_tests(
    records: Sequence[RunRecord],
    gamma: float = HEADLINE_GAMMA,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> list[Decision]:
    """H1-H3 for every strategy of one dataset, then pooled over the strategies (only when
    there are several)."""
    settings = group_settings(records)
    datasets = sorted({key[0] for key in settings})
    if len(datasets) != 1:
        raise ValueError(
            f"the hypotheses pool strategies of one dataset; these records hold {datasets}"
        )
    strategies = sorted({key[1] for key in settings})
    per_strategy = {s: _comparisons(settings, datasets[0], s, gamma) for s in strategies}
    tests = []
    for name, comparison, decide in HYPOTHESES:
        sets = [found[name] for found in per_strategy.values() if name in found]
        for pair_set in sets:
            tests.append(
                _test(name, comparison, pair_set.strategy, [pair_set], decide,
                      resamples=resamples, seed=seed)
            )  # fmt: skip
        if len(sets) > 1:
            tests.append(
                _test(name, comparison, POOLED, sets, decide, resamples=resamples, seed=seed)
            )
    return tests


def decide(e: Evidence) -> list[Decision]:
    """H1-H3 per strategy and pooled (the pooled row decides), and MUR's cost over never."""
    return hypothesis_tests(e.records, e.headline_gamma, resamples=e.resamples, seed=e.seed)


EXPERIMENT = Experiment(
    "small-backbone-external-judge",
    "results/prereg-small-backbone-external-judge.md",
    reads="folders",
    decide=decide,
)
