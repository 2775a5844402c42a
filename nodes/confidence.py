"""DeepConf's trace confidences (Fu et al., arXiv 2508.15260): pure functions of the top-k
token logprobs, shared by the live stopping rules and their offline replay.

- token confidence C_i = -(1/k) * sum of the k top logprobs at token i (high: the model's
  distribution is peaked, it is sure);
- group confidence: the mean of C over a sliding window of `window` tokens ending at token i,
  taken once a full window is there (a trace shorter than one window is one group);
- a trace's lowest group, bottom-10% (mean of its lowest tenth of groups), tail (mean of its
  last `tail` tokens) and mean confidence.

Token confidences are rounded to `CONFIDENCE_DECIMALS` where they are made, so the numbers a
run records are the numbers its live rule compared: replaying a rule on records is exact.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mur.nodes.llm import LOGPROB_FLOOR

CONFIDENCE_DECIMALS = 3
BOTTOM_FRACTION = 0.1
"""DeepConf's bottom-10% group confidence."""


def token_confidence(top_logprobs: Sequence[float]) -> float:
    """C_i: minus the mean of the top-k logprobs of one token (a -inf counts as the floor)."""
    if not top_logprobs:
        raise ValueError(
            "a token without top logprobs has no confidence: ask the server for them "
            "(top_logprobs >= 1)"
        )
    total = math.fsum(max(lp, LOGPROB_FLOOR) for lp in top_logprobs)
    return round(-total / len(top_logprobs), CONFIDENCE_DECIMALS)


def token_entropy(top_logprobs: Sequence[float]) -> float:
    """EAGer's top-k entropy of one token, in nats: -sum p ln p over its k top probabilities,
    renormalized (high: the model hesitates between several tokens); rounded like C_i."""
    if not top_logprobs:
        raise ValueError(
            "a token without top logprobs has no entropy: ask the server for them "
            "(top_logprobs >= 1)"
        )
    peak = max(top_logprobs)
    weights = [math.exp(max(lp, LOGPROB_FLOOR) - peak) for lp in top_logprobs]
    total = math.fsum(weights)
    entropy = -math.fsum(w / total * math.log(w / total) for w in weights if w > 0)
    return round(max(entropy, 0.0), CONFIDENCE_DECIMALS)


def group_confidences(confidences: Sequence[float], window: int) -> list[float]:
    """The mean of every full window of `window` tokens, in order; a trace shorter than one
    window is one group (its mean); no tokens, no groups."""
    _check_window(window)
    if not confidences:
        return []
    if len(confidences) < window:
        return [math.fsum(confidences) / len(confidences)]
    watch = GroupWatch(window)
    return [group for c in confidences if (group := watch.push(c)) is not None]


@dataclass(frozen=True)
class TraceConfidence:
    """DeepConf's measures of one trace (higher: more confident); None without tokens."""

    lowest_group: float | None
    bottom_10: float | None
    tail: float | None
    mean: float | None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


CONFIDENCE_MEASURES = tuple(TraceConfidence.__dataclass_fields__)


def trace_confidence(confidences: Sequence[float], *, window: int, tail: int) -> TraceConfidence:
    """The four measures of a trace's token confidences."""
    if not confidences:
        return TraceConfidence(None, None, None, None)
    groups = group_confidences(confidences, window)
    lowest = sorted(groups)[: max(1, math.ceil(len(groups) * BOTTOM_FRACTION))]
    last = confidences[-tail:] if tail > 0 else confidences
    return TraceConfidence(
        lowest_group=min(groups),
        bottom_10=math.fsum(lowest) / len(lowest),
        tail=math.fsum(last) / len(last),
        mean=math.fsum(confidences) / len(confidences),
    )


class GroupWatch:
    """The group confidence as tokens arrive: `push` returns the current full window's mean
    (None until `window` tokens are there). What the live stopping rule and its replay read."""

    def __init__(self, window: int) -> None:
        _check_window(window)
        self.window = window
        self._last: deque[float] = deque(maxlen=window)

    def push(self, confidence: float) -> float | None:
        self._last.append(confidence)
        if len(self._last) < self.window:
            return None
        # An exact sum each time, not a running one: the live rule and its replay must agree
        # to the last bit, whatever order the tokens were pushed in.
        return math.fsum(self._last) / self.window


def first_breach(confidences: Sequence[float], threshold: float, window: int) -> int | None:
    """The index of the first token whose full-window group confidence is below `threshold`
    (DeepConf's online stop), or None when no window falls below it."""
    watch = GroupWatch(window)
    for index, confidence in enumerate(confidences):
        group = watch.push(confidence)
        if group is not None and group < threshold:
            return index
    return None


def _check_window(window: int) -> None:
    if window < 1:
        raise ValueError(f"the group window must be at least 1 token, got {window}")
