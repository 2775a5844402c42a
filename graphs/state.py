"""The graph's State (what a run carries) and Context (how it is configured)."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from nodes.budget import BudgetSettings
from nodes.draft import StepCandidate
from nodes.gates import GATES, GateParams, check_gate
from nodes.judge import Judgement
from nodes.llm import add_usage

STRATEGIES: tuple[str, ...] = ("critic", "best_of_n", "foresight", "thinking")
FinishReason = Literal["answer", "end_of_sequence", "max_steps", "empty_step", "context_length"]


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")


def _describe(default: Any, description: str, **kwargs: Any) -> Any:
    return field(default=default, metadata={"description": description, **kwargs})


@dataclass(kw_only=True)
class Context:
    """Run settings (LangGraph `context_schema`); defaults are the paper's."""

    gate: str = _describe(
        "mur", f"Which steps to scale: {', '.join(GATES)} (mur = the gamma-gate)."
    )
    gamma: float = _describe(
        0.9, "MUR scales step t iff m_t > M_{t-1} - ln(gamma); larger gamma scales more. > 0."
    )
    alpha: float = _describe(0.9, "Momentum decay: M_t = alpha M_{t-1} + (1-alpha) m_t. In (0,1).")
    bias_correction: bool = _describe(
        False, "Compare against M_{t-1} / (1 - alpha^(t-1)) (the paper's appendix) instead of M."
    )
    tau: float = _describe(0.9, "SMART gate: scale when mean token probability < tau.")
    random_rate: float = _describe(0.5, "Random gate: probability of scaling a step (t >= 2).")
    seed: int = _describe(0, "Seed of the random gate and of foresight's sampled selection.")
    budget_tokens: int | None = _describe(
        None,
        "Budget mode (gate mur): tokens per question (backbone + external); the threshold "
        "adapts so the budget holds, most uncertain steps first. Replaces gamma.",
    )
    target_scale_rate: float | None = _describe(
        None,
        "Budget mode (gate mur): scale about this fraction of steps (0..1), the most "
        "uncertain first. Replaces gamma.",
    )
    expected_steps: int = _describe(8, "Budget mode: the steps a solution is expected to take.")
    scale_cost_factor: float = _describe(
        4.0, "Budget mode: a scaled step's extra cost in drafts, until one has been measured."
    )
    max_steps: int = _describe(20, "Steps before one unconstrained continuation asks the answer.")
    max_step_tokens: int = _describe(2048, "Token cap of one step (and of the fallback).")
    num_candidates: int = _describe(4, "N: candidates per scaled step (best_of_n, foresight).")
    reuse_draft: bool = _describe(
        False,
        "best_of_n / foresight: keep the drafted step as candidate 0 and sample N-1 more "
        "(the paper discards it).",
    )
    critic_rounds: int = _describe(1, "Critic: judge/revise rounds per scaled step.")
    judge_max_tokens: int = _describe(1024, "Token cap of one verifier/critic judgement.")
    foresight_steps: int = _describe(
        1, "Foresight rollout length in steps; 0 rolls out the whole solution."
    )
    foresight_selection: Literal["sample", "argmax"] = _describe(
        "sample", "Foresight: draw the step by its weight (seeded) or take the best weight."
    )
    thinking_budget: int = _describe(2048, "Thinking switch: token cap of the thinking.")
    thinking_style: Literal["prefix", "qwen3"] = _describe(
        "prefix",
        "prefix: continue '<think>\\nOkay, so I need to' (any template); qwen3: a fresh turn "
        "with chat_template_kwargs enable_thinking=true.",
    )

    def __post_init__(self) -> None:
        check_gate(self.gate)
        self.gate_params()  # validates gamma, alpha, tau, rate
        for name in (
            "max_steps",
            "max_step_tokens",
            "num_candidates",
            "critic_rounds",
            "judge_max_tokens",
            "thinking_budget",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.budget_tokens is not None and self.budget_tokens < 1:
            raise ValueError(f"budget_tokens must be >= 1, got {self.budget_tokens}")
        if self.target_scale_rate is not None and not 0 <= self.target_scale_rate <= 1:
            raise ValueError(f"target_scale_rate must lie in [0, 1], got {self.target_scale_rate}")
        if self.budget_mode and self.gate != "mur":
            raise ValueError("budget_tokens / target_scale_rate adapt the mur gate: use gate mur")
        if self.budget_tokens is not None and self.target_scale_rate is not None:
            raise ValueError("give budget_tokens or target_scale_rate, not both")
        if self.expected_steps < 1 or self.scale_cost_factor <= 0:
            raise ValueError("expected_steps must be >= 1 and scale_cost_factor > 0")
        if self.foresight_steps < 0:
            raise ValueError(f"foresight_steps must be >= 0, got {self.foresight_steps}")
        if self.foresight_selection not in ("sample", "argmax"):
            raise ValueError("foresight_selection must be 'sample' or 'argmax'")
        if self.thinking_style not in ("prefix", "qwen3"):
            raise ValueError("thinking_style must be 'prefix' or 'qwen3'")

    @property
    def budget_mode(self) -> bool:
        return self.budget_tokens is not None or self.target_scale_rate is not None

    def budget_settings(self) -> BudgetSettings:
        return BudgetSettings(
            budget_tokens=self.budget_tokens,
            target_scale_rate=self.target_scale_rate,
            expected_steps=self.expected_steps,
            scale_cost_factor=self.scale_cost_factor,
            gamma=self.gamma,
            alpha=self.alpha,
            bias_correction=self.bias_correction,
        )

    def gate_params(self, margin: float | None = None) -> GateParams:
        return GateParams(
            alpha=self.alpha,
            gamma=self.gamma,
            bias_correction=self.bias_correction,
            tau=self.tau,
            rate=self.random_rate,
            seed=self.seed,
            margin=margin,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


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


class InputState(TypedDict):
    question: str
    system_prompt: NotRequired[str | None]


class OutputState(TypedDict):
    question: str
    answer: str | None
    finish_reason: FinishReason | None
    steps: list[StepRecord]
    usage: dict[str, int]
    fallback: Fallback | None
    config: dict[str, Any]


OUTPUT_KEYS: tuple[str, ...] = tuple(OutputState.__annotations__)


def output_of(state: dict[str, Any]) -> dict[str, Any]:
    """The output contract's keys of a full state (what `ainvoke` returns)."""
    return {key: state.get(key) for key in OUTPUT_KEYS}


class State(InputState, OutputState):
    """Everything one solution carries; the momentum lives here."""

    steps: Annotated[list[StepRecord], operator.add]
    usage: Annotated[dict[str, int], add_usage]
    momentum: float
    draft: StepCandidate | None
    gate: GateRecord | None
    kept: StepCandidate | None
    refine: dict[str, Any] | None
    done: bool
    answer_room: int | None
    """Tokens the answer request may use when a draft overflowed the context (None: none)."""


class RefineInput(TypedDict):
    question: str
    system_prompt: NotRequired[str | None]
    steps: list[StepRecord]
    draft: StepCandidate


class RefineOutput(TypedDict):
    kept: StepCandidate
    refine: dict[str, Any]
    usage: dict[str, int]


class RefineState(RefineInput, RefineOutput):
    """A refine subgraph's scratch space; only `kept`, `refine` and `usage` go back."""

    usage: Annotated[dict[str, int], add_usage]
    candidates: list[StepCandidate]
    judgements: list[Judgement]
    rollouts: list[dict[str, Any]]
    critiques: list[dict[str, Any]]
    thought: dict[str, Any]
