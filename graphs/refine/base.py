"""What every refine strategy shares with the loop: what it reads and hands back, its record,
and the reads and writes of a step.

A strategy is a subgraph, mounted in the loop's graph as a node of its own name: it reads the
question, the kept steps and the flagged draft (`RefineInput`) and hands back the step to
keep, a record of what it did and the tokens it spent (`RefineOutput`). Its record is a
`RefineRecord` (a `ChoiceRecord` for one that chooses among candidates) that the output
contract carries as a plain dict and that knows how to summarise itself. How a strategy is
built (its scratch state, its nodes' base class and wiring, its registry entry) is
graphs/refine/kit.py.

The strategies sit below graphs.state (its Context lists them): they read a run's settings
through `Kit.settings`, and their nodes take a `Runtime[Context]`. The Context is the type
checker's only (graphs.state imports this package, so it is not there yet at run time): LangGraph
resolves node and route annotations when it adds them, and reads `Context` here as `Any`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langgraph.runtime import Runtime
from pydantic import BaseModel

from mur.graphs.records import StepRecord
from mur.nodes.draft import StepCandidate, sample_steps
from mur.nodes.llm import Reply
from mur.nodes.uncertainty import step_confidence, step_uncertainty

if TYPE_CHECKING:
    from mur.graphs.state import Context as Context  # re-exported to the strategies
else:
    Context = Any  # what LangGraph resolves in the strategies' annotations (see above)

Update = dict[str, Any]


class RefineInput(TypedDict):
    """What a strategy reads of the loop's state."""

    question: str
    system_prompt: NotRequired[str | None]
    steps: list[StepRecord]
    draft: StepCandidate


class RefineOutput(TypedDict):
    """What a strategy writes back: the step to keep, its record, the tokens it spent."""

    kept: StepCandidate
    refine: dict[str, Any]
    usage: dict[str, int]


def run_settings(runtime: Runtime[Context], defaults: Context) -> Context:
    """A run's settings: its Context, or `defaults` for a run that passes none (every node of
    the graph reads its settings through here)."""
    return runtime.context or defaults


class CandidateSummary(BaseModel):
    """A generated step as refine records show it: with what each gate reads of it, so a
    recorded trace replays any gate on the drafts it scaled (None in older records)."""

    text: str
    uncertainty: float | None
    num_tokens: int
    confidence: float | None = None
    first_token_entropy: float | None = None

    @classmethod
    def of(cls, candidate: StepCandidate) -> CandidateSummary:
        logprobs = candidate["logprobs"]
        return cls(
            text=candidate["text"],
            uncertainty=step_uncertainty(logprobs) if logprobs else None,
            num_tokens=candidate["num_tokens"],
            confidence=step_confidence(logprobs) if logprobs else None,
            first_token_entropy=candidate.get("first_token_entropy"),
        )


class RefineRecord(BaseModel):
    """What a strategy did to one step; each strategy extends it with its own fields."""

    strategy: str
    draft: CandidateSummary

    @abstractmethod
    def summary(self) -> str:
        """A few words for the step's line in run.py's output (e.g. `chose 2 of 4`)."""

    def as_dict(self) -> dict[str, Any]:
        """The record as the output contract and records.jsonl hold it."""
        return self.model_dump()


class ChoiceRecord(RefineRecord):
    """The record of a strategy that chose one of N candidates (each strategy's own
    candidates, with what it scored them by, extend `CandidateSummary`)."""

    candidates: Sequence[CandidateSummary]
    chosen: int

    def summary(self) -> str:
        return f"chose {self.chosen + 1} of {len(self.candidates)}"


def kept_texts(state: Mapping[str, Any]) -> list[str]:
    return [step["text"] for step in state["steps"]]


def step_index(state: Mapping[str, Any]) -> int:
    """t: the index of the step being refined."""
    return len(state["steps"]) + 1


def position(state: Mapping[str, Any]) -> tuple[list[str], int]:
    """Where a strategy is: the texts of the kept steps, and t, the step being refined."""
    return kept_texts(state), step_index(state)


async def write_step(
    model: BaseChatModel,
    messages: Sequence[BaseMessage],
    index: int,
    ctx: Context,
    role: Literal["backbone", "external"] = "backbone",
) -> tuple[StepCandidate, Reply]:
    """One sample of step `index` continuing `messages`, in the run's step format, cap and
    top logprobs: how the loop drafts a step, a strategy writes one again, and the external
    model writes one in a cascade (`role` external)."""
    (step,), reply = await sample_steps(
        model,
        messages,
        index=index,
        n=1,
        max_tokens=ctx.max_step_tokens,
        fmt=ctx.step_style,
        top_logprobs=ctx.top_logprobs,
        role=role,
    )
    return step, reply
