"""Every pre-registered experiment a report decides, by name (`mur report --prereg NAME`).
Adding one is a module with an `EXPERIMENT` and a line here (docs/extending.md)."""

from __future__ import annotations

from mur.evals.report.experiment import Experiment
from mur.experiments import (
    bfcl_escalation,
    branching_fresh,
    cascade,
    parallel_traces,
    small_backbone,
)
from mur.nodes.registry import Registry

EXPERIMENTS: Registry[Experiment] = Registry(
    "experiment",
    small_backbone.EXPERIMENT,
    parallel_traces.EXPERIMENT,
    branching_fresh.EXPERIMENT,
    cascade.EXPERIMENT,
    bfcl_escalation.EXPERIMENT,
)
