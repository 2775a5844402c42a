"""What every refine strategy shares: its place in the loop, its record, its registry entry.

A strategy is a subgraph that reads the question, the kept steps and the flagged draft
(`RefineInput`) and hands back the step to keep, a record of what it did and the tokens it
spent (`RefineOutput`). Its scratch state is its own; its record is a `RefineRecord` that the
output contract carries as a plain dict and that knows how to summarise itself.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from pydantic import BaseModel

from graphs.state import Context, RefineInput, RefineOutput
from nodes.draft import StepCandidate, sample_steps, step_messages
from nodes.uncertainty import step_uncertainty

ContextOf = Callable[[Runtime[Context]], Context]
Update = dict[str, Any]
Builder = Callable[[BaseChatModel, BaseChatModel, ContextOf], CompiledStateGraph]


class CandidateSummary(BaseModel):
    """A generated step as refine records show it."""

    text: str
    uncertainty: float | None
    num_tokens: int

    @classmethod
    def of(cls, candidate: StepCandidate) -> CandidateSummary:
        logprobs = candidate["logprobs"]
        return cls(
            text=candidate["text"],
            uncertainty=step_uncertainty(logprobs) if logprobs else None,
            num_tokens=candidate["num_tokens"],
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


@dataclass(frozen=True)
class Strategy:
    """A registry entry: the strategy's name, its subgraph builder and its record type."""

    name: str
    build: Builder
    record: type[RefineRecord]

    def summarise(self, record: Mapping[str, Any]) -> str:
        return self.record.model_validate(record).summary()


def kept_texts(state: Mapping[str, Any]) -> list[str]:
    return [step["text"] for step in state["steps"]]


def step_index(state: Mapping[str, Any]) -> int:
    """t: the index of the step being refined."""
    return len(state["steps"]) + 1


def single_step_turn(candidate: StepCandidate) -> StepCandidate:
    """A step written in a side turn that asked for that one step (a revision after feedback,
    a step after thinking): the model ending that turn ends the step, not the solution."""
    return {**candidate, "ended_by_model": False}


def new_graph(scratch: type) -> StateGraph:
    """A refine subgraph over the strategy's own scratch state, with the shared interface."""
    return StateGraph(
        scratch, context_schema=Context, input_schema=RefineInput, output_schema=RefineOutput
    )


def sample_candidates_node(backbone: BaseChatModel, context_of: ContextOf):
    """The node that samples N candidates for the step in one request (best_of_n, foresight):
    the paper discards the draft; with `reuse_draft` the draft (a sample from the same
    policy) is candidate 0."""

    async def sample_candidates(state: dict[str, Any], runtime: Runtime[Context]) -> Update:
        ctx = context_of(runtime)
        index = step_index(state)
        reused = [state["draft"]] if ctx.reuse_draft else []
        if ctx.num_candidates - len(reused) < 1:
            return {"candidates": reused}
        fmt = ctx.step_style
        messages = step_messages(
            state["question"], state.get("system_prompt"), kept_texts(state), index, fmt
        )
        candidates, reply = await sample_steps(
            backbone,
            messages,
            index=index,
            n=ctx.num_candidates - len(reused),
            max_tokens=ctx.max_step_tokens,
            fmt=fmt,
        )
        return {"candidates": reused + candidates, "usage": reply.usage("backbone").as_dict()}

    return sample_candidates
