"""Stopping a trace part-way (Context's `trace_stop`; not a request's stop strings, nor the
settle rules that stop drawing traces, nor a run being shut down): the stop rules, one
registry entry each. The warm-up batch sets a rule's threshold; each later trace is checked
against it (after every step, and for the confidence rule token by token inside a step, where
the request is closed and the server stops generating). A stopped trace has no vote.

- momentum (MUR's): the stop_keep quantile of the warm-ups' final momentum; a later trace
  stops once its momentum rises above it;
- confidence (DeepConf online): the (1 - stop_keep) quantile of the warm-ups' lowest group
  confidence; a later trace stops once a group falls below it.
stop_keep 0.9 keeps about nine in ten traces like the warm-ups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mur.nodes.confidence import first_breach
from mur.nodes.registry import Registry
from mur.nodes.voting import TraceOutcome, TraceRules


@dataclass(frozen=True)
class StopRule:
    """One rule that stops a later trace part-way."""

    name: str
    threshold: Callable[[Sequence[TraceOutcome], TraceRules], float | None]
    """The threshold from the warm-up traces (None: no stopping)."""
    breached: Callable[[TraceRules, float, float, Sequence[float]], bool]
    """(rules, threshold, the trace's momentum so far, its token confidences so far)."""
    description: str
    reads_confidence: bool = False
    """It reads token confidences (top_logprobs), and watches them inside a step."""


def _momentum_threshold(warmup: Sequence[TraceOutcome], rules: TraceRules) -> float:
    return float(np.quantile([o.momentum for o in warmup], rules.stop_keep))


def _confidence_threshold(warmup: Sequence[TraceOutcome], rules: TraceRules) -> float | None:
    lows = [o.confidence.lowest_group for o in warmup if o.confidence.lowest_group is not None]
    return float(np.quantile(lows, 1.0 - rules.stop_keep)) if lows else None


STOP_RULES = Registry(
    "stop rule",
    StopRule("none", lambda warmup, rules: None, lambda *_: False, "every trace runs in full"),
    StopRule(
        "momentum",
        _momentum_threshold,
        lambda rules, threshold, momentum, confidences: momentum > threshold,
        "MUR's: its momentum rises above the warm-ups'",
    ),
    StopRule(
        "confidence",
        _confidence_threshold,
        lambda rules, threshold, momentum, confidences: (
            first_breach(confidences, threshold, rules.group_window) is not None
        ),
        "DeepConf's online rule: a group's confidence falls below the warm-ups'",
        reads_confidence=True,
    ),
)


def stop_threshold(warmup: Sequence[TraceOutcome], rules: TraceRules) -> float | None:
    """The stop rule's threshold, from the warm-up traces (None: no stopping)."""
    if not warmup:
        return None
    return STOP_RULES[rules.trace_stop].threshold(warmup, rules)


def should_stop(
    rules: TraceRules,
    threshold: float | None,
    *,
    momentum: float,
    confidences: Sequence[float],
) -> bool:
    """The stop rule after a step: the trace's momentum so far, or its token confidences so
    far (every full window among them), against the threshold."""
    if threshold is None:
        return False
    return STOP_RULES[rules.trace_stop].breached(rules, threshold, momentum, confidences)
