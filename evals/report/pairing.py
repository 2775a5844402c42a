"""Records grouped into settings, and two settings paired on the questions both ran.

A setting is (dataset, strategy, gate label, gamma). A question's score and tokens are the
means over its samples, so extra samples never count as extra questions. Every comparison the
reports make (a setting against always, a MUR setting against MUR's default, one folder against
another) goes through `pair`, so they all pair and average the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mur.evals.harness.run_record import RunRecord, total_tokens
from mur.evals.report import stats
from mur.nodes.gate_labels import gate_family

AVERAGE = "average"  # the dataset label of the rows averaged over datasets
REFERENCE_GATE = "always"  # Per-Step Scale: every setting is paired with it

SettingKey = tuple[str, str, str, float | None]  # dataset, strategy, gate label, gamma


class SettingRuns:
    """The runs of one setting, with per-question means (question = problem id)."""

    def __init__(self, records: Sequence[RunRecord]) -> None:
        self.records = list(records)
        self.by_question: dict[str, list[RunRecord]] = defaultdict(list)
        for record in self.records:
            self.by_question[str(record["problem_id"])].append(record)

    def per_question(self, value: Callable[[RunRecord], float]) -> dict[str, float]:
        return {q: stats.mean([value(r) for r in rs]) for q, rs in self.by_question.items()}

    def scores(self) -> dict[str, float]:
        return self.per_question(lambda r: 1.0 if r["correct"] else 0.0)

    def total_tokens(self) -> dict[str, float]:
        return self.per_question(total_tokens)

    def scaled_share(self) -> float:
        """Of the kept steps per question, the share the gate scaled."""
        total = mean_over(self.per_question(lambda r: r["steps_total"]))
        scaled = mean_over(self.per_question(lambda r: r["steps_scaled"]))
        return scaled / total if total else 0.0

    def one_sample(self) -> bool:
        """One run per question: a paired sign test on these scores is McNemar's."""
        return len(self.records) == len(self.by_question)


def group_settings(records: Sequence[RunRecord]) -> dict[SettingKey, SettingRuns]:
    """The records by setting (dataset, strategy, gate label, gamma)."""
    groups: dict[SettingKey, list[RunRecord]] = defaultdict(list)
    for record in records:
        key = (record["dataset"], record["strategy"], record["gate"], record["gamma"])
        groups[key].append(record)
    return {key: SettingRuns(group) for key, group in groups.items()}


def mean_over(values: dict[str, float], questions: Sequence[str] | None = None) -> float:
    """The mean of per-question values, over ``questions`` (all of them by default)."""
    keys = values.keys() if questions is None else questions
    return stats.mean([values[q] for q in keys])


def setting_order(key: SettingKey) -> tuple:
    """Datasets, strategies, then the paper's order: never, always, the baselines, MUR."""
    dataset, strategy, gate, gamma = key
    rank = {"never": 0, "always": 1, "mur": 3}.get(gate_family(gate), 2)
    return (dataset == AVERAGE, dataset, strategy, rank, gate, -1.0 if gamma is None else gamma)


@dataclass(frozen=True)
class Pairing:
    """A setting against a reference setting on the questions both ran."""

    comparison: stats.PairedComparison  # setting minus reference
    accuracy: float
    reference_accuracy: float
    tokens: float  # total (backbone + external) per question
    reference_tokens: float

    @property
    def n(self) -> int:
        return self.comparison.n

    @property
    def tokens_ratio(self) -> float:
        return self.tokens / self.reference_tokens if self.reference_tokens else math.nan


def pairing_json(pairing: Pairing) -> dict[str, Any]:
    """A pairing as report.json writes it, its token ratio included."""
    return {**asdict(pairing), "tokens_ratio": pairing.tokens_ratio}


def pair(
    setting: SettingRuns,
    reference: SettingRuns,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> Pairing | None:
    """``setting`` against ``reference`` on their common questions; None if they share none."""
    scores, reference_scores = setting.scores(), reference.scores()
    comparison = stats.compare_paired(scores, reference_scores, resamples=resamples, seed=seed)
    if comparison is None:
        return None
    common = sorted(scores.keys() & reference_scores.keys())
    return Pairing(
        comparison=comparison,
        accuracy=mean_over(scores, common),
        reference_accuracy=mean_over(reference_scores, common),
        tokens=mean_over(setting.total_tokens(), common),
        reference_tokens=mean_over(reference.total_tokens(), common),
    )
