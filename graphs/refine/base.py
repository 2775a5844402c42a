"""What every refine strategy shares: its place in the loop, its record, its registry entry.

A strategy is a subgraph, mounted in the loop's graph as a node of its own name: it reads the
question, the kept steps and the flagged draft (`RefineInput`) and hands back the step to
keep, a record of what it did and the tokens it spent (`RefineOutput`). Its scratch state is
its own; its record is a `RefineRecord` that the output contract carries as a plain dict and
that knows how to summarise itself. Its nodes get the injected models and the run's settings
from a `Kit`, and add every node that asks a model with `Kit.add_model_node`.

The strategies sit below graphs.state (its Context lists them): they read a run's settings
through `Kit.settings`, and their nodes take a `Runtime[Context]`. The Context is the type
checker's only (graphs.state imports this package, so it is not there yet at run time): LangGraph
resolves node and route annotations when it adds them, and reads `Context` here as `Any`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypeAlias, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import BaseModel

from mur.graphs.attempts import Node
from mur.graphs.model_calls import ModelCalls
from mur.graphs.records import StepRecord
from mur.nodes.draft import StepCandidate, sample_steps, step_messages
from mur.nodes.llm import Reply
from mur.nodes.uncertainty import step_uncertainty
from mur.servers.transport_errors import ContextOverflow

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


@dataclass(frozen=True)
class Kit:
    """What one strategy's subgraph is built from: the injected models, the graph's default
    settings, and the graph's one way of calling a model (`ModelCalls`)."""

    strategy: str
    backbone: BaseChatModel
    verifier: BaseChatModel
    defaults: Context
    calls: ModelCalls

    def settings(self, runtime: Runtime[Context]) -> Context:
        """The run's settings (the graph's defaults for a run that passes none)."""
        return run_settings(runtime, self.defaults)

    def add_model_node(self, graph: RefineBuilder, name: str, node: Node[Context]) -> None:
        """Add `node`, which asks a model: retried on transient faults, every attempt
        counted, and a request that no longer fits the context ends the strategy with the
        draft kept (the loop then ends the solution)."""
        self.calls.add(graph, name, node, on_overflow=self._keep_the_draft)

    def _keep_the_draft(self, state: Mapping[str, Any], overflow: ContextOverflow) -> Command[str]:
        # The strategy's output, given to the loop now: its next nodes do not run.
        return Command(
            graph=Command.PARENT,
            update={
                "kept": None,
                "refine": {"strategy": self.strategy, "context_length": str(overflow)},
                "done": True,
                "finish_reason": "context_length",
                "usage": state.get("usage") or {},  # what the strategy's earlier nodes spent
            },
        )


RefineBuilder: TypeAlias = StateGraph[Any, Context, RefineInput, RefineOutput]
"""A strategy's subgraph being built; its run Context is the loop graph's, which mounts it."""
RefineGraph: TypeAlias = CompiledStateGraph[Any, Context, RefineInput, RefineOutput]
"""A strategy's compiled subgraph."""
Builder = Callable[[Kit], RefineGraph]


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
    """A registry entry: the strategy's name, its subgraph builder and its record type, and
    whether it asks the verifier (a strategy that does not leaves the verifier's server idle, so
    that server's speed does not bound how many questions a benchmark keeps in flight)."""

    name: str
    build: Builder
    record: type[RefineRecord]
    uses_verifier: bool = True

    def summarise(self, record: Mapping[str, Any]) -> str:
        return self.record.model_validate(record).summary()


def kept_texts(state: Mapping[str, Any]) -> list[str]:
    return [step["text"] for step in state["steps"]]


def step_index(state: Mapping[str, Any]) -> int:
    """t: the index of the step being refined."""
    return len(state["steps"]) + 1


async def write_step(
    backbone: BaseChatModel, messages: Sequence[BaseMessage], index: int, ctx: Context
) -> tuple[StepCandidate, Reply]:
    """One sample of step `index` continuing `messages`, in the run's step format, cap and
    top logprobs: how the loop drafts a step and a strategy writes one again."""
    (step,), reply = await sample_steps(
        backbone,
        messages,
        index=index,
        n=1,
        max_tokens=ctx.max_step_tokens,
        fmt=ctx.step_style,
        top_logprobs=ctx.top_logprobs,
    )
    return step, reply


def single_step_turn(candidate: StepCandidate) -> StepCandidate:
    """A step written in a side turn that asked for that one step (a revision after feedback,
    a step after thinking): the model ending that turn ends the step, not the solution."""
    return {**candidate, "ended_by_model": False}


def new_graph(scratch: type) -> RefineBuilder:
    """A refine subgraph over the strategy's own scratch state, with the shared interface (the
    run's Context comes from the loop's graph, which mounts it)."""
    return StateGraph(scratch, input_schema=RefineInput, output_schema=RefineOutput)


def candidate_graph(
    nodes: CandidateNodes,
    scratch: type,
    score: tuple[str, Node[Context]],
    choose: Callable[..., Any],
    name: str,
) -> RefineGraph:
    """The wiring of a strategy that chooses among N candidates (`nodes`, over its scratch
    state): sample_candidates -> `score` (its name and node, which asks a model) -> choose."""
    kit = nodes.kit
    graph = new_graph(scratch)
    kit.add_model_node(graph, "sample_candidates", nodes.sample_candidates)
    kit.add_model_node(graph, score[0], score[1])
    graph.add_node("choose", choose)
    graph.add_edge(START, "sample_candidates")
    graph.add_edge("sample_candidates", score[0])
    graph.add_edge(score[0], "choose")
    graph.add_edge("choose", END)
    return graph.compile(name=name)


class CandidateNodes:
    """Nodes of the strategies that choose among N candidates (best_of_n, foresight)."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit

    async def sample_candidates(
        self, state: Mapping[str, Any], runtime: Runtime[Context]
    ) -> Update:
        """N candidates for the step in one request: the paper discards the draft; with
        `reuse_draft` the draft (a sample from the same policy) is candidate 0."""
        ctx = self.kit.settings(runtime)
        index = step_index(state)
        reused = [state["draft"]] if ctx.reuse_draft else []
        if ctx.num_candidates - len(reused) < 1:
            return {"candidates": reused}
        fmt = ctx.step_style
        messages = step_messages(
            state["question"], state.get("system_prompt"), kept_texts(state), index, fmt
        )
        candidates, reply = await sample_steps(
            self.kit.backbone,
            messages,
            index=index,
            n=ctx.num_candidates - len(reused),
            max_tokens=ctx.max_step_tokens,
            fmt=fmt,
            top_logprobs=ctx.top_logprobs,
        )
        return {"candidates": reused + candidates, "usage": reply.usage("backbone").as_dict()}
