"""The report's headline: MUR against always, and against random at MUR's own rate.

The paper's claim is accuracy per token: MUR (with and without bias correction) at the
headline gamma is paired with always (Per-Step Scale) on the questions both ran. Its matched
baseline is the random gate at the share of steps MUR scaled: the rate is stated, and once
the folder holds a random run at that rate MUR is paired with it too (does MUR's choice of
steps beat chance at the same budget?).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.pairing import (
    REFERENCE_GATE,
    Pairing,
    SettingKey,
    SettingRuns,
    group_settings,
    pair,
    pairing_json,
)
from mur.nodes.gate_labels import random_rate

#: Gate labels the headline compares with always: MUR as the paper runs it, and with bias
#: correction.
HEADLINE_GATES = ("mur", "mur+bc")
HEADLINE_GAMMA = 0.9  # the paper's default
#: A random run counts as MUR's matched baseline when its rate is within this share of MUR's
#: measured rate (table1 writes the rate to 3 significant digits; a hand-typed one may round).
RANDOM_MATCH_TOLERANCE = 0.1


@dataclass(frozen=True)
class Headline:
    """A MUR setting against always on the questions both ran."""

    dataset: str
    strategy: str
    gate: str
    gamma: float
    tokens: float
    always_tokens: float
    accuracy: float
    always_accuracy: float
    comparison: stats.PairedComparison
    one_sample: bool  # one sample per question in both: the exact test is McNemar's
    random_rate: float  # the random gate's rate that scales as many steps as this setting did
    against_random: RandomMatch | None  # this setting against random at its rate, if run

    @property
    def tokens_ratio(self) -> float:
        return self.tokens / self.always_tokens if self.always_tokens else math.nan


@dataclass(frozen=True)
class RandomMatch:
    """A MUR setting against the random gate at (about) its scaled rate, on the questions both
    ran: does MUR's choice of steps beat chance at the same budget of scaled steps?"""

    gate: str  # the random run's label, e.g. random@0.218
    scaled_share: float  # of the random run's kept steps, the share it scaled
    pairing: Pairing  # the MUR setting minus random
    one_sample: bool  # one sample per question in both: the exact test is McNemar's


def matched_random_rate(records: Sequence[RunRecord]) -> float:
    """The random gate draws for steps 2+ (step 1 has no momentum and is never scaled): the
    rate that scales as many of those steps as these records did."""
    scaled = sum(r["steps_scaled"] for r in records)
    eligible = sum(max(r["steps_total"] - 1, 0) for r in records)
    return scaled / eligible if eligible else 0.0


def headline_json(h: Headline) -> dict[str, Any]:
    document = {**asdict(h), "tokens_ratio": h.tokens_ratio}
    if h.against_random is not None:
        document["against_random"]["pairing"] = pairing_json(h.against_random.pairing)
    return document


def headlines(
    records: Sequence[RunRecord],
    gamma: float = HEADLINE_GAMMA,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> list[Headline]:
    """MUR (and MUR with bias correction) at ``gamma`` against always, per dataset and
    strategy, on the questions both ran. Empty where either is missing."""
    settings = group_settings(records)
    found = []
    for (dataset, strategy, gate, setting_gamma), setting in settings.items():
        if gate not in HEADLINE_GATES or setting_gamma is None:
            continue
        if not math.isclose(setting_gamma, gamma):
            continue
        always = settings.get((dataset, strategy, REFERENCE_GATE, None))
        if always is None:
            continue
        pairing = pair(setting, always, resamples=resamples, seed=seed)
        if pairing is None:
            continue
        rate = matched_random_rate(setting.records)
        found.append(
            Headline(
                dataset=dataset,
                strategy=strategy,
                gate=gate,
                gamma=setting_gamma,
                tokens=pairing.tokens,
                always_tokens=pairing.reference_tokens,
                accuracy=pairing.accuracy,
                always_accuracy=pairing.reference_accuracy,
                comparison=pairing.comparison,
                one_sample=setting.one_sample() and always.one_sample(),
                random_rate=rate,
                against_random=against_random(
                    setting, settings, (dataset, strategy), rate, resamples=resamples, seed=seed
                ),
            )
        )
    return sorted(found, key=lambda h: (h.dataset, h.strategy, HEADLINE_GATES.index(h.gate)))


def matched_random_runs(
    settings: dict[SettingKey, SettingRuns], section: tuple[str, str], rate: float
) -> tuple[str, SettingRuns] | None:
    """The random run of a (dataset, strategy) whose rate is closest to ``rate`` (within
    `RANDOM_MATCH_TOLERANCE`), with its label; None when there is none."""
    candidates = [
        (abs(run_rate - rate), gate, runs)
        for (dataset, strategy, gate, _), runs in settings.items()
        if (dataset, strategy) == section
        and (run_rate := random_rate(gate)) is not None
        and abs(run_rate - rate) <= RANDOM_MATCH_TOLERANCE * rate
    ]
    if not candidates:
        return None
    _, gate, runs = min(candidates, key=lambda found: found[:2])
    return gate, runs


def against_random(
    setting: SettingRuns,
    settings: dict[SettingKey, SettingRuns],
    section: tuple[str, str],
    rate: float,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> RandomMatch | None:
    """``setting`` against the random run of its dataset and strategy whose rate is closest to
    ``rate`` (within `RANDOM_MATCH_TOLERANCE`); None when no such run shares a question."""
    matched = matched_random_runs(settings, section, rate)
    if matched is None:
        return None
    gate, random_runs = matched
    pairing = pair(setting, random_runs, resamples=resamples, seed=seed)
    if pairing is None:
        return None
    one_sample = setting.one_sample() and random_runs.one_sample()
    return RandomMatch(gate, random_runs.scaled_share(), pairing, one_sample)
