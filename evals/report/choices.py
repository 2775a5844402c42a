"""Choosing MUR's settings by data: each MUR setting against MUR as the paper runs it.

The report's main table pairs every setting with always. Choosing bias correction and a gamma
needs another pairing: every MUR setting a folder ran (`mur` at each gamma of the sweep,
`mur+bc`) against `mur` at the paper's gamma, on the questions both ran. The accuracy change
comes with its paired interval and exact test, next to the token change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.pairing import Pairing, group_settings, pair, setting_order
from mur.nodes.gate_labels import gate_family

DEFAULT_GATE = "mur"  # the paper's MUR: no bias correction


@dataclass(frozen=True)
class Choice:
    """A MUR setting against the default (`mur` at the default gamma)."""

    dataset: str
    strategy: str
    gate: str
    gamma: float
    pairing: Pairing
    scaled_share: float  # of this setting's kept steps, the share its gate scaled


def mur_choices(
    records: Sequence[RunRecord],
    default_gamma: float,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> list[Choice]:
    """Every other MUR setting against `mur` at ``default_gamma``, per dataset and strategy.
    Empty where the default was not run or shares no question."""
    settings = group_settings(records)
    defaults = {
        (dataset, strategy): runs
        for (dataset, strategy, gate, gamma), runs in settings.items()
        if gate == DEFAULT_GATE and gamma is not None and math.isclose(gamma, default_gamma)
    }
    found = []
    for (dataset, strategy, gate, gamma), runs in settings.items():
        if gate_family(gate) != DEFAULT_GATE or gamma is None:
            continue  # never, always, the baselines
        default = defaults.get((dataset, strategy))
        if default is None or default is runs:
            continue
        pairing = pair(runs, default, resamples=resamples, seed=seed)
        if pairing is None:
            continue
        found.append(Choice(dataset, strategy, gate, gamma, pairing, runs.scaled_share()))
    return sorted(found, key=lambda c: setting_order((c.dataset, c.strategy, c.gate, c.gamma)))
