"""The statistics behind the evaluation tables: bootstrap intervals and the paired exact test.

The unit of evidence is the question: a question's score is the mean correctness of its
samples, so several samples of one question never count as independent questions. Two
settings are compared only on the questions both ran (paired), which removes the
question-difficulty variance that dominates small benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as scipy_stats

#: Bootstrap resamples and seed: fixed, so the same records always give the same table.
RESAMPLES = 10_000
SEED = 0
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class PairedComparison:
    """A setting against a reference on the questions both ran.

    ``better``/``worse``: questions where the setting scored higher/lower than the reference.
    ``p_value``: two-sided exact binomial test of better vs worse at 1/2, the sign test; with
    one sample per question these are the discordant pairs and it is McNemar's exact test.
    ``difference``: mean score difference (setting - reference), with its paired bootstrap
    interval (None below two questions).
    """

    n: int
    better: int
    worse: int
    p_value: float
    difference: float
    interval: Interval | None


def bootstrap_interval(
    values: Sequence[float] | npt.NDArray[np.float64],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """Percentile bootstrap interval of the mean of ``values`` (one value per question).

    None for fewer than two values: one question says nothing about the spread. A percentile
    interval lies within the range of the values, so scores in [0, 1] give an interval in
    [0, 1]; when every value is equal it is that value, zero width.
    """
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return None
    result = scipy_stats.bootstrap(
        (data,),
        np.mean,
        n_resamples=resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    # Guard the float edges: the mean of resampled values cannot leave their range.
    low, high = np.clip(result.confidence_interval, data.min(), data.max())
    return Interval(float(low), float(high))


def exact_sign_test(better: int, worse: int) -> float:
    """Two-sided exact binomial p-value of ``better`` successes in ``better + worse`` at 1/2;
    1.0 when there is no discordant question (no evidence either way)."""
    if better + worse == 0:
        return 1.0
    return float(scipy_stats.binomtest(better, better + worse, 0.5).pvalue)


def compare_paired(
    scores: Mapping[str, float],
    reference: Mapping[str, float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> PairedComparison | None:
    """``scores`` against ``reference`` (question id -> score) on their common questions; None
    when they share no question."""
    common = sorted(scores.keys() & reference.keys())
    if not common:
        return None
    diffs = np.array([scores[q] - reference[q] for q in common], dtype=float)
    better, worse = int(np.sum(diffs > 0)), int(np.sum(diffs < 0))
    return PairedComparison(
        n=len(common),
        better=better,
        worse=worse,
        p_value=exact_sign_test(better, worse),
        difference=float(diffs.mean()),
        interval=bootstrap_interval(diffs, resamples=resamples, seed=seed),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation); NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: how long at least one run was in flight,
    so runs that overlapped count once and pauses between resumed sessions not at all."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
