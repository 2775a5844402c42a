"""What a solution records, step by step: below the State and the strategies, which both carry
these (the strategies are below the Context, which lists them)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

FinishReason = Literal["answer", "end_of_sequence", "max_steps", "empty_step", "context_length"]


class StepRecord(TypedDict):
    """A kept step, as the output contract shows it."""

    index: int
    text: str
    uncertainty: float
    confidence: float
    momentum_before: float
    momentum_after: float
    scaled: bool
    strategy: str | None
    num_tokens: int
    refine: NotRequired[dict[str, Any] | None]


class GateRecord(TypedDict):
    """What the gate saw and decided for the current draft."""

    uncertainty: float
    confidence: float
    threshold: float | None
    scale: bool


class Fallback(TypedDict):
    text: str
    num_tokens: int
