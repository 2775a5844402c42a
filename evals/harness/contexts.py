"""A gate label plus shared settings, as the Context of one run: the one place that does it.

run.py (a single solve and the checks of its flags), the benchmark plan, the endpoint and the
performance benchmarks all build a run's Context here, so a label (`mur+bc`, `random@0.12`,
`mur[budget=800]`, see nodes.gate_labels) means the same setting everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.state import Context
from nodes.gate_labels import parse_gate_label


def context_for(
    label: str, settings: Mapping[str, Any] | None = None, *, gamma: float | None = None
) -> Context:
    """The Context of gate label `label` over `settings` (Context fields shared by the runs:
    a profile's recommendations, then the command line's or a request's).

    `gamma`, when given, replaces the settings' gamma; the label's own settings (bias
    correction, a random rate, a budget) come on top, and the label's gate replaces any
    `gate` in `settings`. Raises ValueError naming the label (a malformed one) or ContextError
    naming the field (a bad value)."""
    gate, overrides = parse_gate_label(label)
    chosen = {} if gamma is None else {"gamma": gamma}
    return Context(**{**(settings or {}), **chosen, **overrides, "gate": gate})
