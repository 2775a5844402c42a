"""The graph's State (what a run carries) and Context (how it is configured)."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graphs.records import Fallback, FinishReason, GateRecord, StepRecord
from graphs.refine import StrategyName
from nodes.budget import BudgetSettings
from nodes.draft import STEP_FORMATS, StepCandidate, StepFormat
from nodes.gates import GateName, GateParams, question_seed
from nodes.usage import add_usage


class ContextError(ValueError):
    """Bad run settings, in one line that names each field at fault and its value; `errors`
    keeps pydantic's structured errors (field paths) for callers that report them apart."""

    def __init__(self, message: str, errors: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(message)
        self.errors = list(errors)


def _one_line(exc: ValidationError, known: tuple[str, ...]) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown setting {where}: choose among {', '.join(known)}")
        elif not error["loc"]:  # a check across fields (model validator)
            problems.append(error["msg"].removeprefix("Value error, "))
        else:
            wanted = error["msg"].removeprefix("Input should ")
            problems.append(f"{where} must {wanted}, got {error['input']!r}")
    return "; ".join(problems)


class Context(BaseModel):
    """Run settings (LangGraph `context_schema`), the one source of them: run.py's flags and
    the endpoint's validation are generated from these fields. Defaults are the paper's.

    Strict: a setting of the wrong type (`"0.8"` for a number, `true` for an integer) is
    refused, never coerced; a bad value raises ContextError (a ValueError) naming the field.
    """

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    strategy: StrategyName = Field(
        "critic",
        description="What scaling a step means: the refine strategy the gate calls "
        "(graphs/refine).",
    )
    gate: GateName = Field("mur", description="Which steps to scale (mur = the gamma-gate).")
    gamma: float = Field(
        0.9,
        gt=0,
        allow_inf_nan=False,
        description="MUR scales step t iff m_t > M_{t-1} - ln(gamma); larger gamma scales more.",
    )
    alpha: float = Field(
        0.9, gt=0, lt=1, description="Momentum decay: M_t = alpha M_{t-1} + (1-alpha) m_t."
    )
    bias_correction: bool = Field(
        False,
        description="Compare against M_{t-1} / (1 - alpha^(t-1)) (the paper's appendix) "
        "instead of M.",
    )
    tau: float = Field(
        0.9, gt=0, le=1, description="SMART gate: scale when mean token probability < tau."
    )
    random_rate: float = Field(
        0.5, ge=0, le=1, description="Random gate: probability of scaling a step (t >= 2)."
    )
    seed: int = Field(
        0,
        description="Seed of the random gate and of foresight's selection, mixed with the "
        "question text so that each question draws its own numbers.",
    )
    budget_tokens: int | None = Field(
        None,
        ge=1,
        description="Budget mode (gate mur): tokens per question (backbone + external); the "
        "threshold adapts so the budget holds, most uncertain steps first. Replaces gamma.",
    )
    target_scale_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Budget mode (gate mur): scale about this fraction of steps, the most "
        "uncertain first. Replaces gamma.",
    )
    expected_steps: int = Field(
        8, ge=1, description="Budget mode: the steps a solution is expected to take."
    )
    scale_cost_factor: float = Field(
        4.0,
        gt=0,
        allow_inf_nan=False,
        description="Budget mode: a scaled step's extra cost in drafts, until one is measured.",
    )
    max_steps: int = Field(
        20, ge=1, description="Steps before one unconstrained continuation asks the answer."
    )
    max_step_tokens: int = Field(
        2048, ge=1, description="Token cap of one step (and of the fallback)."
    )
    num_candidates: int = Field(
        4, ge=1, description="N: candidates per scaled step (best_of_n, foresight)."
    )
    reuse_draft: bool = Field(
        False,
        description="best_of_n / foresight: keep the drafted step as candidate 0 and sample "
        "N-1 more (the paper discards it).",
    )
    critic_rounds: int = Field(1, ge=1, description="Critic: judge/revise rounds per scaled step.")
    judge_max_tokens: int = Field(
        1024, ge=1, description="Token cap of one verifier/critic judgement."
    )
    judge_force_verdict: bool = Field(
        False,
        description="A judgement that ends without a verdict (e.g. cut by judge_max_tokens) is "
        "continued from the verdict line for its Yes/No. Off (the paper's rule): no verdict "
        "means the critic revises and best_of_n scores P(Yes) = 0.",
    )
    foresight_steps: int = Field(
        1, ge=0, description="Foresight rollout length in steps; 0 rolls out the whole solution."
    )
    foresight_selection: Literal["sample", "argmax"] = Field(
        "sample", description="Foresight: draw the step by its weight (seeded) or take the best."
    )
    thinking_budget: int = Field(
        2048, ge=1, description="Thinking switch: token cap of the thinking."
    )
    step_format: Literal["marker", "paragraph"] = Field(
        "marker",
        description="How the backbone writes steps: marker (the paper: 'Step1: ...', a step "
        "ends at the next marker) or paragraph (a step ends at a blank line, as PRM data and "
        "search-and-learn; for models that write no markers).",
    )
    thinking_style: Literal["prefix", "qwen3"] = Field(
        "prefix",
        description="prefix: continue '<think>\\nOkay, so I need to' (templates that leave a "
        "continued message alone, not Qwen3's: vLLM issue 28089); qwen3: a fresh turn with "
        "chat_template_kwargs enable_thinking=true.",
    )

    def __init__(self, **settings: Any) -> None:
        try:
            super().__init__(**settings)
        except ValidationError as exc:
            raise ContextError(_one_line(exc, self.field_names()), exc.errors()) from None

    @model_validator(mode="after")
    def _budget_mode_needs_mur(self) -> Context:
        if self.budget_tokens is not None and self.target_scale_rate is not None:
            raise ValueError("give budget_tokens or target_scale_rate, not both")
        if self.budget_mode and self.gate != "mur":
            raise ValueError(
                f"budget_tokens / target_scale_rate adapt the mur gate: use gate mur, "
                f"not {self.gate!r}"
            )
        return self

    @property
    def step_style(self) -> StepFormat:
        """The StepFormat that `step_format` names."""
        return STEP_FORMATS[self.step_format]

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

    def gate_params(self, question: str, margin: float | None = None) -> GateParams:
        """The gate's numbers for one question (its own random draws, see `question_seed`)."""
        return GateParams(
            alpha=self.alpha,
            gamma=self.gamma,
            bias_correction=self.bias_correction,
            tau=self.tau,
            rate=self.random_rate,
            seed=question_seed(self.seed, question),
            margin=margin,
        )

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)


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


__all__ = [
    "OUTPUT_KEYS",
    "Context",
    "ContextError",
    "Fallback",
    "FinishReason",
    "GateRecord",
    "InputState",
    "OutputState",
    "State",
    "StepRecord",
    "output_of",
]
