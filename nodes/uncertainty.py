"""Step uncertainty and momentum: pure functions of token log-probabilities.

The contract (mur-algorithm.md) defines a step's uncertainty as the mean negative
log-probability of every token the model generated for it, stop-string tokens included,
and the momentum as an exponential moving average of the uncertainties of kept steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _require_tokens(logprobs: Sequence[float]) -> None:
    if len(logprobs) == 0:
        raise ValueError(
            "a step with no generated tokens has no uncertainty: treat it as an error or as "
            "the end of the solution, never as 0"
        )


def step_uncertainty(logprobs: Sequence[float]) -> float:
    """m_t: the mean of -logprob over the step's generated tokens."""
    _require_tokens(logprobs)
    return -math.fsum(logprobs) / len(logprobs)


def step_confidence(logprobs: Sequence[float]) -> float:
    """SMART's token-level confidence: the mean of exp(logprob), i.e. of token probabilities."""
    _require_tokens(logprobs)
    return math.fsum(math.exp(lp) for lp in logprobs) / len(logprobs)


def check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in the open interval (0, 1), got {alpha}")


def update_momentum(momentum: float, m: float, alpha: float) -> float:
    """M_t = alpha * M_{t-1} + (1 - alpha) * m_t."""
    check_alpha(alpha)
    return alpha * momentum + (1.0 - alpha) * m


def corrected_momentum(momentum: float, steps_seen: int, alpha: float) -> float:
    """Adam-style bias correction M / (1 - alpha^k) after k updates from M_0 = 0.

    With no update yet there is nothing to correct and the raw momentum (0) is returned.
    """
    check_alpha(alpha)
    if steps_seen <= 0:
        return momentum
    return momentum / (1.0 - alpha**steps_seen)
