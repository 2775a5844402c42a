"""What a solution records, step by step: below the State and the strategies, which both carry
these (the strategies are below the Context, which lists them)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from mur.nodes.draft import EntropySpike

FinishReason = Literal[
    "answer", "end_of_sequence", "max_steps", "empty_step", "context_length", "stopped"
]
"""Why a solution ended; `stopped`: a trace's stop rule ended it part-way (it has no vote)."""


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
    confidences: NotRequired[list[float]]
    """DeepConf's confidence of each token (only when the run asked for top_logprobs)."""
    entropy_spikes: NotRequired[list[EntropySpike]]
    """EAGer's branch points inside the step (only when the run branches by entropy)."""
    first_token_entropy: NotRequired[float]
    """The top-k entropy of the first token of the draft the gate saw (only when the run
    asked for top_logprobs): what the first_token gate reads, kept so any run replays it."""


class GateRecord(TypedDict):
    """What the gate saw and decided for the current draft."""

    uncertainty: float
    confidence: float
    threshold: float | None
    scale: bool
    first_token_entropy: NotRequired[float]


class Fallback(TypedDict):
    text: str
    num_tokens: int


class TraceSummary(TypedDict):
    """One trace of a question, as the output contract lists it beside the voted answer."""

    index: int
    answer: str | None
    finish_reason: FinishReason | None
    stopped: bool
    """The stop rule ended it part-way: it has no vote."""
    steps: int
    tokens: int
    """Completion tokens it cost (backbone + external), stopped or not."""
    momentum: float
    """MUR's momentum after its last kept step."""
    confidence: dict[str, float | None] | None
    """DeepConf's measures (lowest_group, bottom_10, tail, mean); None without top_logprobs."""
    weight: float
    """Its weight in the vote (0: it did not vote)."""
    parent: NotRequired[int | None]
    """A branch: the trace whose steps before `branch_step` it kept (None: it started afresh)."""
    branch_step: NotRequired[int | None]
    """A branch: the first step it drew itself."""
    branch_token: NotRequired[int | None]
    """A branch inside a step: the first token of `branch_step` it drew itself."""
    branch_points: NotRequired[int]
    """Under a branch rule: how many points the rule finds in its steps (kept ones included),
    what it offers a later branch as a parent (EAGer's: its tokens over the entropy threshold)."""
