"""MUR's gate inside any LangChain agent: `MURMiddleware`, for `create_agent(middleware=[...])`.

An agent's model calls are a sequence of steps, as a MUR solution's are. Each call asks for
token logprobs (`logprobs=True` in the request's model settings), its uncertainty is measured
as MUR measures a step (mean negative logprob over every generated token, a tool call's
arguments included: vLLM returns logprobs for the whole generated text, the Hermes
`<tool_call>` block its parser turns into `tool_calls` too), and the gate MUR's graph uses
(nodes.gates: the same registry, `decide`, `GateHistory`) decides whether the call is unusual
for this run. A flagged call is acted on, as set: rewritten by a stronger model
(`escalate_to`), or drawn again until `samples` draws vote (tool names and normalised
arguments; ties to the least uncertain draw).

The momentum lives in the agent's state (`MURAgentState`), so a checkpointer keeps it, Studio
shows it and a resumed thread carries on from it; `before_agent` starts each run afresh, as
MUR starts each question afresh. Every AIMessage carries what was measured and done in
`response_metadata["mur"]`, and its `usage_metadata` counts every call made for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Annotated, Any, Literal, NotRequired, get_args

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    hook_config,
)
from langchain.agents.middleware.types import OmitFromSchema
from langchain.chat_models import init_chat_model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.messages.ai import UsageMetadata, add_usage
from langgraph.runtime import Runtime
from langgraph.types import Command

from mur.graphs.state import Context
from mur.nodes.agent_calls import (
    CallReading,
    agreement_key,
    last_user_text,
    measured_uncertainty,
    read_call,
    vote,
)
from mur.nodes.gates import GateDecision, GateHistory, decide
from mur.nodes.llm import gather_all

GATE_SETTINGS = (
    "gate",
    "gamma",
    "alpha",
    "bias_correction",
    "tau",
    "random_rate",
    "first_token_threshold",
    "seed",
    "top_logprobs",
)
"""The fields of `graphs.Context` the middleware reads: the gate's, checked as Context checks
them (the refine strategies, traces and budget mode belong to MUR's own graph)."""
Action = Literal["kept", "escalated", "voted", "budget_spent"]
MomentumScope = Literal["run", "thread"]
SHOWN = OmitFromSchema(input=True, output=False)
"""A field of the run's output (and of Studio's view), never of its input."""


class MURAgentState(AgentState[Any]):
    """What the middleware keeps of a run in the agent's state, checkpointed with it."""

    mur_momentum: NotRequired[Annotated[float, SHOWN]]
    """M_t after the run's last model call (M_0 = 0, as in MUR)."""
    mur_uncertainties: NotRequired[Annotated[list[float], SHOWN]]
    """The uncertainty each of the run's calls added to the momentum, in order (the gates'
    history: its length is the number of calls gated so far)."""
    mur_tokens: NotRequired[Annotated[int, SHOWN]]
    """Tokens generated in this run by every model call the middleware made (drafts,
    escalations, draws): what `escalation_budget` and `token_limit` are compared with."""


def fresh_run() -> dict[str, Any]:
    """A run's state before its first model call: no momentum, no history, no tokens."""
    return {"mur_momentum": 0.0, "mur_uncertainties": [], "mur_tokens": 0}


def reply_message(response: ModelResponse[Any]) -> AIMessage:
    """The AIMessage of a model call's response (a structured-output reply adds a ToolMessage)."""
    for message in response.result:
        if isinstance(message, AIMessage):
            return message
    raise TypeError("the agent's model call returned no AIMessage: MURMiddleware reads one")


@dataclass
class GatedCall:
    """The gate's view of one call: its number in the run, what was measured, the decision,
    the run's history before it and the tokens the run had generated before it."""

    step: int
    reading: CallReading
    decision: GateDecision
    history: GateHistory
    tokens_before: int


@dataclass
class Outcome:
    """What acting on a call produced: which reply is kept, the uncertainty the momentum
    reads, each call's record and usage."""

    kept: int
    kept_uncertainty: float
    calls: list[dict[str, Any]] = field(default_factory=list)
    usages: list[UsageMetadata] = field(default_factory=list)


def _call_record(
    role: str, message: AIMessage, uncertainty: float | None, usage: UsageMetadata
) -> dict[str, Any]:
    return {
        "role": role,
        "model": message.response_metadata.get("model_name"),
        "uncertainty": uncertainty,
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
    }


def _escalation_outcome(gated: GatedCall, messages: Sequence[AIMessage]) -> Outcome:
    """The draft, and the stronger model's rewrite when there is one (kept). The momentum reads
    the draft: the stronger model's logprobs are on another model's scale (MUR's escalate
    strategy does the same by default)."""
    draft = messages[0]
    outcome = Outcome(len(messages) - 1, gated.reading.uncertainty)
    reading = gated.reading
    outcome.calls.append(_call_record("draft", draft, reading.uncertainty, reading.usage))
    outcome.usages.append(gated.reading.usage)
    for message in messages[1:]:  # its uncertainty is recorded when it returns logprobs
        uncertainty, usage = measured_uncertainty(message)
        outcome.calls.append(_call_record("escalation", message, uncertainty, usage))
        outcome.usages.append(usage)
    return outcome


def _vote_outcome(
    gated: GatedCall, messages: Sequence[AIMessage], readings: Sequence[CallReading]
) -> Outcome:
    """The draws (the flagged call is the first): the kept one is what most agree on; the
    momentum reads its uncertainty, as MUR's graph reads the kept step's."""
    uncertainties = [reading.uncertainty for reading in readings]
    kept, votes = vote([agreement_key(message) for message in messages], uncertainties)
    outcome = Outcome(kept, uncertainties[kept])
    for index, (message, reading) in enumerate(zip(messages, readings, strict=True)):
        role = "draft" if index == 0 else "draw"
        record = _call_record(role, message, reading.uncertainty, reading.usage)
        outcome.calls.append({**record, "votes": votes[index], "kept": index == kept})
        outcome.usages.append(reading.usage)
    return outcome


def _whole_number(value: object, *, at_least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= at_least


class MURMiddleware(AgentMiddleware[MURAgentState, Any, Any]):
    """Measures every model call of a `create_agent` agent, keeps the momentum in its state and
    acts on the calls MUR's gate flags: `escalate_to` a stronger model, or `samples` draws
    that vote. Settings:

    - `escalate_to`: a chat model (or an `init_chat_model` string) that rewrites a flagged
      call, asked with the agent's own request; or `samples`: the draws a flagged call
      becomes (itself and samples - 1 more), of which the one most agree on is kept.
    - the gate's settings, named and checked as `graphs.Context` names them: `gate` ("mur"),
      `gamma`, `alpha`, `bias_correction`, `tau`, `random_rate`, `first_token_threshold`,
      `seed`, `top_logprobs` (what the `first_token` gate reads).
    - `escalation_budget`: tokens a run may generate before flagged calls are no longer acted
      on; `token_limit`: tokens after which the run ends with a message saying so.
    - `momentum_scope`: "run" (each `invoke` starts afresh) or "thread" (a checkpointed
      thread's runs share one momentum and one token count: a conversation whose every user
      turn is a run, e.g. BFCL's multi-turn cases, is then one sequence of steps).

    The first call of a run has no momentum to compare with: the gates MUR's graph starts at
    step 2 (`Gate.from_step`: mur and average, which compare with the history, and random)
    never flag it, and the momentum starts from it. The others (always, smart, first_token)
    judge it on its own.
    """

    state_schema = MURAgentState

    def __init__(
        self,
        *,
        escalate_to: BaseChatModel | str | None = None,
        samples: int | None = None,
        escalation_budget: int | None = None,
        token_limit: int | None = None,
        momentum_scope: MomentumScope = "run",
        **gate_settings: Any,
    ) -> None:
        super().__init__()
        if momentum_scope not in get_args(MomentumScope):
            raise ValueError(f"momentum_scope must be run or thread, got {momentum_scope!r}")
        unknown = sorted(set(gate_settings) - set(GATE_SETTINGS))
        if unknown:
            raise ValueError(
                f"MURMiddleware takes the gate's settings only ({', '.join(GATE_SETTINGS)}), "
                f"got {', '.join(unknown)}"
            )
        if (escalate_to is None) == (samples is None):
            raise ValueError(
                "give MURMiddleware one way to act on a flagged call: escalate_to (a stronger "
                "model) or samples (draws that vote)"
            )
        if samples is not None and not _whole_number(samples, at_least=2):
            raise ValueError(
                f"samples must be an integer >= 2 (the flagged call is one), got {samples!r}"
            )
        for name, cap in (("escalation_budget", escalation_budget), ("token_limit", token_limit)):
            if cap is not None and not _whole_number(cap, at_least=1):
                raise ValueError(f"{name} must be a number of tokens >= 1, got {cap!r}")
        self.context = Context(**gate_settings)
        self.escalate_to = (
            init_chat_model(escalate_to) if isinstance(escalate_to, str) else escalate_to
        )
        self.samples = samples or 1
        self.escalation_budget = escalation_budget
        self.token_limit = token_limit
        self.momentum_scope = momentum_scope

    def before_agent(self, state: MURAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Each run starts afresh, as MUR starts each question (with `momentum_scope="run"`;
        "thread" starts only a thread's first run so): a resumed run (an interrupt's
        `Command(resume=...)`, `invoke(None)`) does not pass here and keeps its momentum."""
        if self.momentum_scope == "thread" and "mur_momentum" in state:
            return None
        return fresh_run()

    async def abefore_agent(
        self, state: MURAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: MURAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Past `token_limit`, the run ends here with a message saying so (tools a previous
        call asked for have run: the thread is left consistent)."""
        spent = state.get("mur_tokens", 0)
        if self.token_limit is None or spent < self.token_limit:
            return None
        line = (
            f"Stopped by MURMiddleware's token limit: this run generated {spent} tokens, its "
            f"limit is {self.token_limit}. Raise token_limit, or ask again in a new run."
        )
        record = {"action": "token_limit", "run_tokens": spent, "token_limit": self.token_limit}
        message = AIMessage(content=line, response_metadata={"mur": record})
        return {"jump_to": "end", "messages": [message]}

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: MURAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ExtendedModelResponse[Any]:
        asked = self._asking_logprobs(request)
        draft = handler(asked)
        gated = self._gate(request, draft)
        action = self._action(gated)
        extra: list[ModelResponse[Any]] = []
        if action == "escalated":
            extra = [handler(self._escalated(request))]
        elif action == "voted":
            extra = [handler(asked) for _ in range(self.samples - 1)]
        return self._finish(gated, action, [draft, *extra])

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ExtendedModelResponse[Any]:
        asked = self._asking_logprobs(request)
        draft = await handler(asked)
        gated = self._gate(request, draft)
        action = self._action(gated)
        extra: list[ModelResponse[Any]] = []
        if action == "escalated":
            extra = [await handler(self._escalated(request))]
        elif action == "voted":  # concurrently: the first failure cancels the others
            extra = await gather_all(*(handler(asked) for _ in range(self.samples - 1)))
        return self._finish(gated, action, [draft, *extra])

    def _asking_logprobs(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The agent's request, asking for token logprobs (and top logprobs when the gate
        reads them): ChatOpenAI sends its bound settings with the request."""
        settings = {**request.model_settings, "logprobs": True}
        if self.context.top_logprobs:
            settings["top_logprobs"] = self.context.top_logprobs
        return request.override(model_settings=settings)

    def _escalated(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The agent's own request (messages, tools, tool choice, settings) on the stronger
        model; logprobs are not forced on it, since a hosted model may refuse them."""
        if self.escalate_to is None:
            raise RuntimeError("MURMiddleware escalates only when given escalate_to")
        return request.override(model=self.escalate_to)

    def _gate(self, request: ModelRequest[Any], draft: ModelResponse[Any]) -> GatedCall:
        """The call's measurements and MUR's decision on them, from the run's state."""
        state: Mapping[str, Any] = request.state
        reading = read_call(reply_message(draft), self.context.top_logprobs)
        history = GateHistory(
            momentum=float(state.get("mur_momentum", 0.0)),
            kept_uncertainties=list(state.get("mur_uncertainties", [])),
        )
        step = len(history.kept_uncertainties) + 1
        decision = decide(
            self.context.gate,
            step=step,
            uncertainty=reading.uncertainty,
            confidence=reading.confidence,
            history=history,
            params=self.context.gate_params(last_user_text(request.messages)),
            first_token_entropy=reading.first_token_entropy,
        )
        return GatedCall(step, reading, decision, history, int(state.get("mur_tokens", 0)))

    def _action(self, gated: GatedCall) -> Action:
        """What to do with the call: act on it when flagged and the escalation budget (this
        call's draft included) is not spent."""
        if not gated.decision.scale:
            return "kept"
        spent = gated.tokens_before + gated.reading.usage["output_tokens"]
        if self.escalation_budget is not None and spent >= self.escalation_budget:
            return "budget_spent"
        return "escalated" if self.escalate_to is not None else "voted"

    def _finish(
        self, gated: GatedCall, action: Action, responses: Sequence[ModelResponse[Any]]
    ) -> ExtendedModelResponse[Any]:
        """The kept reply, its message carrying the record and every call's usage, and the
        state update: the momentum after it, its history and the run's tokens."""
        messages = [reply_message(response) for response in responses]
        if action == "voted":
            readings = [gated.reading]
            readings += [read_call(m, self.context.top_logprobs) for m in messages[1:]]
            outcome = _vote_outcome(gated, messages, readings)
        else:
            outcome = _escalation_outcome(gated, messages)
        history = gated.history
        before = history.momentum
        history.commit(outcome.kept_uncertainty, self.context.alpha)
        tokens = gated.tokens_before + sum(usage["output_tokens"] for usage in outcome.usages)
        record: dict[str, Any] = {
            "call": gated.step,
            "gate": self.context.gate,
            "uncertainty": gated.reading.uncertainty,
            "confidence": gated.reading.confidence,
            "threshold": gated.decision.threshold,
            "flagged": gated.decision.scale,
            "action": action,
            "momentum_before": before,
            "momentum_after": history.momentum,
            "kept_uncertainty": outcome.kept_uncertainty,
            "run_tokens": tokens,
            "calls": outcome.calls,
        }
        if gated.reading.first_token_entropy is not None:
            record["first_token_entropy"] = gated.reading.first_token_entropy
        chosen, response = messages[outcome.kept], responses[outcome.kept]
        kept = chosen.model_copy(
            update={
                "response_metadata": {**chosen.response_metadata, "mur": record},
                "usage_metadata": reduce(add_usage, outcome.usages),
            }
        )
        result = [kept if message is chosen else message for message in response.result]
        update = {
            "mur_momentum": history.momentum,
            "mur_uncertainties": history.kept_uncertainties,
            "mur_tokens": tokens,
        }
        return ExtendedModelResponse(
            model_response=ModelResponse(result, response.structured_response),
            command=Command(update=update),
        )
