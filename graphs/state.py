"""The graph's State (what a run carries) and Context (how it is configured)."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, TypedDict, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mur.graphs.records import Fallback, FinishReason, GateRecord, StepRecord, TraceSummary
from mur.graphs.refine import STRATEGIES
from mur.nodes.branching import BRANCH_RULES, BranchParams
from mur.nodes.budget import BudgetSettings
from mur.nodes.draft import STEP_FORMATS, StepCandidate, StepFormat
from mur.nodes.gate_labels import parse_gate_label
from mur.nodes.gates import GATES, GateParams, question_seed
from mur.nodes.settling import SETTLE_RULES
from mur.nodes.trace_stop import STOP_RULES
from mur.nodes.usage import add_usage
from mur.nodes.voting import VOTES, MeasureName, TraceRules

if TYPE_CHECKING:  # mypy reads a name; pydantic, the CLI and Studio the registry's Literal
    from _typeshed import DataclassInstance

    StrategyName = str
    GateName = str
    VoteName = str
    SettleName = str
    StopName = str
    BranchName = str
else:
    StrategyName, GateName, VoteName, SettleName, StopName, BranchName = (
        registry.choice()
        for registry in (STRATEGIES, GATES, VOTES, SETTLE_RULES, STOP_RULES, BRANCH_RULES)
    )
Rules = TypeVar("Rules", bound="DataclassInstance")


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
        elif error["type"] == "literal_error":  # as a registry's (nodes.registry) words it
            names = error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
            problems.append(f"unknown {where} {error['input']!r}: choose one of {names}")
        elif not error["loc"] or error["type"] == "value_error":  # across fields, or a registry's
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
        "critic", description=f"What scaling a step means: {STRATEGIES.describe()}."
    )
    gate: GateName = Field("mur", description=f"Which steps to scale: {GATES.describe()}.")
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
    first_token_threshold: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="first_token gate (GlimpRouter): scale a step whose draft's first token "
        "has a top-k entropy (nats) above this; needs top_logprobs.",
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
    escalate_momentum: Literal["draft", "rescored"] = Field(
        "draft",
        description="Escalate: what the momentum reads after a step the external model "
        "rewrote: the uncertainty of the backbone's draft, or the backbone's uncertainty of "
        "the kept text (rescored with vLLM's prompt logprobs, one more backbone request).",
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

    top_logprobs: int = Field(
        0,
        ge=0,
        le=20,
        description="Ask the server for the top-k logprobs of every step token (k; 0: off) and "
        "record each token's DeepConf confidence (minus their mean); the confidence vote, "
        "measure and stop rule read them.",
    )
    traces: int = Field(
        1,
        ge=1,
        le=64,
        description="Traces: independent solutions of the question (each the MUR loop with "
        "this strategy and gate), at most this many, reduced to one answer by the vote.",
    )
    trace_batch: int | None = Field(
        None,
        ge=1,
        description="Traces started at a time: the first batch (the warm-up) runs in full, "
        "then one batch after another until the settle rule holds or `traces` are drawn. "
        "None: all at once.",
    )
    vote: VoteName = Field("majority", description=f"How traces vote: {VOTES.describe()}.")
    vote_keep: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Vote with only this top fraction of the answered traces (DeepConf's eta), "
        "ranked by the vote's weight (majority: by confidence_measure).",
    )
    confidence_measure: MeasureName = Field(
        "lowest_group",
        description="DeepConf's trace confidence for the confidence vote and filter: the "
        "lowest group, bottom-10% group, tail or mean token confidence.",
    )
    group_window: int = Field(
        64, ge=1, description="DeepConf: tokens in a group (a sliding window of the trace)."
    )
    tail_tokens: int = Field(
        64, ge=1, description="DeepConf: the last tokens that make a trace's tail confidence."
    )
    settle: SettleName = Field(
        "never",
        description="When the traces drawn settle the question, so that no more are drawn "
        f"(needs trace_batch): {SETTLE_RULES.describe()}.",
    )
    consensus: float = Field(
        0.95,
        gt=0.5,
        le=1,
        description="Settle rules consensus and doubling: the leader's share of the vote.",
    )
    beta_confidence: float = Field(
        0.95,
        gt=0.5,
        le=1,
        description="Settle rule beta: stop once P(the leader beats the runner-up) under "
        "Beta(v1 + 1, v2 + 1) reaches this (Adaptive-Consistency's and its_hub's 0.95).",
    )
    trace_stop: StopName = Field(
        "none",
        description="Stop a trace after the warm-up part-way (it then has no vote), checked "
        f"after every step: {STOP_RULES.describe()}.",
    )
    stop_keep: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The stop threshold keeps about this fraction of traces like the warm-up's "
        "(DeepConf-high 0.9, -low 0.1).",
    )
    branch: BranchName = Field(
        "none",
        description="Where a trace after the first batch starts: afresh, or as a branch of a "
        "first-batch trace that keeps its steps before the branch point and draws the rest: "
        f"{BRANCH_RULES.describe()}.",
    )
    branch_entropy: float = Field(
        2.0,
        gt=0,
        allow_inf_nan=False,
        description="EAGer's threshold: a token whose top-k entropy (nats) exceeds it is a "
        "branch point (branch eager).",
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

    @model_validator(mode="after")
    def _trace_rules_need_their_inputs(self) -> Context:
        reading = [
            f"{name} {value}"
            for name, value, reads in (
                ("vote", self.vote, VOTES[self.vote].reads_confidence),
                ("trace_stop", self.trace_stop, STOP_RULES[self.trace_stop].reads_confidence),
            )
            if reads
        ]
        if reading and self.top_logprobs == 0:
            verb = "reads" if len(reading) == 1 else "read"
            raise ValueError(
                f"{' and '.join(reading)} {verb} token confidences: set top_logprobs (e.g. 20)"
            )
        if self.vote_keep < 1 and VOTES[self.vote].ranks_by_confidence and self.top_logprobs == 0:
            raise ValueError(
                f"vote_keep < 1 with the {self.vote} vote ranks traces by confidence: set "
                "top_logprobs (e.g. 20)"
            )
        if BRANCH_RULES[self.branch].reads_entropy and self.top_logprobs == 0:
            raise ValueError(
                f"branch {self.branch} reads token entropies: set top_logprobs (e.g. 20)"
            )
        if GATES[self.gate].reads_first_token and self.top_logprobs == 0:
            raise ValueError(
                f"gate {self.gate} reads the first token's entropy: set top_logprobs (e.g. 20)"
            )
        batch = self.trace_batch
        if (self.settle != "never" or self.trace_stop != "none" or self.branch != "none") and (
            batch is None or batch >= self.traces
        ):
            raise ValueError(
                f"settle, trace_stop and branch act between batches: set trace_batch below "
                f"traces ({self.traces}), got {batch}"
            )
        return self

    def _taken(self, rules: type[Rules], **given: Any) -> Rules:
        """The settings a pure rule of nodes/ reads (a dataclass): each field the Context
        field of its name, but those `given`."""
        taken = {f.name: getattr(self, f.name) for f in fields(rules) if f.name not in given}
        return rules(**taken, **given)

    def trace_rules(self) -> TraceRules:
        """The trace-level settings as the pure rules of nodes.voting read them."""
        return self._taken(TraceRules)

    @property
    def step_style(self) -> StepFormat:
        """The StepFormat that `step_format` names."""
        return STEP_FORMATS[self.step_format]

    @property
    def budget_mode(self) -> bool:
        return self.budget_tokens is not None or self.target_scale_rate is not None

    def budget_settings(self) -> BudgetSettings:
        return self._taken(BudgetSettings)

    def gate_params(self, question: str, margin: float | None = None) -> GateParams:
        """The gate's numbers for one question (its own random draws, see `question_seed`)."""
        return self._taken(GateParams, seed=question_seed(self.seed, question), margin=margin)

    def branch_params(self, question: str) -> BranchParams:
        """The branch rules' numbers for one question (the gate's, and its own seed)."""
        return BranchParams(gate=self.gate_params(question))

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)


def context_for(
    label: str, settings: Mapping[str, Any] | None = None, *, gamma: float | None = None
) -> Context:
    """The Context of gate label `label` (`mur+bc`, `random@0.12`, `mur[budget=800]`:
    nodes.gate_labels) over `settings`, the Context fields shared by the runs (a profile's
    recommendations, then the command line's or a request's): the one place a label becomes
    a setting, so it means the same in run.py, the benchmark plan and the endpoint.

    `gamma`, when given, replaces the settings' gamma; the label's own settings (bias
    correction, a random rate, a budget) come on top, and the label's gate replaces any
    `gate` in `settings`. A gate that reads the first token's entropy asks for
    FIRST_TOKEN_TOP_LOGPROBS top logprobs unless the settings say how many. Raises ValueError
    naming the label (a malformed one) or ContextError naming the field (a bad value)."""
    gate, overrides = parse_gate_label(label)
    chosen = {} if gamma is None else {"gamma": gamma}
    given = {**(settings or {}), **chosen, **overrides, "gate": gate}
    if gate in GATES and GATES[gate].reads_first_token:
        given.setdefault("top_logprobs", FIRST_TOKEN_TOP_LOGPROBS)
    return Context(**given)


FIRST_TOKEN_TOP_LOGPROBS = 20
"""The top-k of a run whose gate reads the first token's entropy and that asked for none."""


class InputState(TypedDict):
    question: str
    system_prompt: NotRequired[str | None]


class TraceInput(InputState):
    """What one trace starts from: the question, its index among the question's traces and
    the stop threshold the warm-up set (None: it runs in full). A branch also starts from its
    parent's steps before the branch step (`steps`, with the momentum after them), and, when
    it branches inside that step, from the step's first characters (`partial`)."""

    trace: NotRequired[int]
    stop_threshold: NotRequired[float | None]
    parent: NotRequired[int | None]
    branch_step: NotRequired[int | None]
    branch_token: NotRequired[int | None]
    steps: NotRequired[list[StepRecord]]
    momentum: NotRequired[float]
    partial: NotRequired[str | None]


class TraceOutput(TypedDict):
    """One trace's solution: what the MUR loop returns."""

    question: str
    answer: str | None
    finish_reason: FinishReason | None
    steps: list[StepRecord]
    usage: dict[str, int]
    fallback: Fallback | None
    config: dict[str, Any]


class OutputState(TraceOutput):
    """The output contract: the voted answer, the steps of the trace that stands for it, the
    usage of every trace (stopped ones included) and one summary per trace."""

    traces: list[TraceSummary]


OUTPUT_KEYS: tuple[str, ...] = tuple(OutputState.__annotations__)


def output_of(state: dict[str, Any]) -> dict[str, Any]:
    """The output contract's keys of a full state (what `ainvoke` returns)."""
    return {key: state.get(key) for key in OUTPUT_KEYS}


class State(TraceInput, TraceOutput):
    """Everything one trace carries; the momentum lives here. (A branch's input gives the
    steps and momentum it starts from; the loop always has both, hence the narrowing.)"""

    steps: Annotated[list[StepRecord], operator.add]  # type: ignore[misc]
    usage: Annotated[dict[str, int], add_usage]
    momentum: float  # type: ignore[misc]
    draft: StepCandidate | None
    gate: GateRecord | None
    kept: StepCandidate | None
    refine: dict[str, Any] | None
    done: bool
    answer_room: int | None
    """Tokens the answer request may use when a draft overflowed the context (None: none)."""


class QuestionState(InputState, OutputState):
    """A question's state: its traces as they finish (summaries and outputs, in finishing
    order), the stop threshold the warm-up set, then the vote's output."""

    usage: Annotated[dict[str, int], add_usage]
    drawn: Annotated[list[TraceSummary], operator.add]
    outputs: Annotated[list[TraceOutput], operator.add]
    stop_threshold: float | None


__all__ = [
    "OUTPUT_KEYS",
    "Context",
    "ContextError",
    "Fallback",
    "FinishReason",
    "GateRecord",
    "InputState",
    "OutputState",
    "QuestionState",
    "State",
    "StepRecord",
    "TraceInput",
    "TraceOutput",
    "TraceSummary",
    "context_for",
    "output_of",
]
