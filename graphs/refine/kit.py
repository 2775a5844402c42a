"""What a refine strategy is built from: the kit of injected models and settings, the scratch
state its subgraph runs over, the base class of its nodes and their wiring, and its registry
entry, which builds the subgraph.

A strategy's file (graphs/refine/<name>.py) holds its record, its scratch state (a `Scratch`
with its own keys), its nodes as methods of a `StrategyNodes` subclass whose `wire` adds them
to the subgraph (a strategy that chooses among N candidates subclasses `CandidateNodes`, which
wires them already), and `STRATEGY = Strategy(name, <scratch>, <nodes>, <record>, <description>)`.
`Strategy.build(kit)` compiles the subgraph `refine_<name>` that the loop mounts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Annotated, Any, ClassVar, TypeAlias

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command

from mur.graphs.attempts import Node
from mur.graphs.model_calls import ModelCalls
from mur.graphs.refine.base import (
    Context,
    RefineInput,
    RefineOutput,
    RefineRecord,
    Update,
    position,
    run_settings,
    write_step,
)
from mur.nodes.draft import StepCandidate, sample_steps, step_messages
from mur.nodes.judge import Judgement, judge_step
from mur.nodes.llm import Reply
from mur.nodes.usage import Usage, add_usage
from mur.servers.clients.transport_errors import ContextOverflow

RefineBuilder: TypeAlias = StateGraph[Any, Context, RefineInput, RefineOutput]
"""A strategy's subgraph being built; its run Context is the loop graph's, which mounts it."""
RefineGraph: TypeAlias = CompiledStateGraph[Any, Context, RefineInput, RefineOutput]
"""A strategy's compiled subgraph."""


class Scratch(RefineInput, RefineOutput):
    """A strategy's scratch state, which the strategy's own extends with its keys: what it reads
    of the loop, and what goes back (`kept`, `refine`, and `usage`, the tokens its nodes spend,
    summed)."""

    usage: Annotated[dict[str, int], add_usage]


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


def chain(graph: RefineBuilder, *names: str) -> None:
    """The edges of nodes that run one after the other: START -> names... -> END."""
    for source, target in pairwise((START, *names, END)):
        graph.add_edge(source, target)


class StrategyNodes(ABC):
    """A strategy's nodes over the kit's injected models, and their wiring.

    A subclass writes its nodes as methods and adds them in `wire`: `self.kit.add_model_node`
    for a node that asks a model, `graph.add_node` for one that does not, then the edges. The
    helpers below are how every strategy asks the verifier about a step and has the backbone
    write one again."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit

    @abstractmethod
    def wire(self, graph: RefineBuilder) -> None:
        """Add the strategy's nodes and edges to `graph` (a StateGraph over its scratch)."""

    async def judge(
        self, state: Mapping[str, Any], paragraph: str, runtime: Runtime[Context]
    ) -> tuple[Judgement, Usage]:
        """The verifier's judgement of `paragraph` as the step being refined, in the context
        of the question and the kept steps, with the run's judge settings."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        return await judge_step(
            self.kit.verifier,
            question=state["question"],
            kept_texts=texts,
            index=index,
            paragraph=paragraph,
            max_tokens=ctx.judge_max_tokens,
            force_verdict=ctx.judge_force_verdict,
        )

    async def rewrite_step(
        self, messages: Sequence[BaseMessage], index: int, ctx: Context
    ) -> tuple[StepCandidate, Reply]:
        """Step `index` written again by the backbone in a side turn that asked for that one
        step (a revision after feedback, a step after thinking): the model ending that turn
        ends the step, not the solution."""
        step, reply = await write_step(self.kit.backbone, messages, index, ctx)
        return {**step, "ended_by_model": False}, reply


class CandidateNodes(StrategyNodes):
    """The nodes of a strategy that chooses among N candidates (best_of_n, foresight), wired
    sample_candidates -> its scoring node (`score`, drawn as `score_node`; it asks a model)
    -> choose."""

    score_node: ClassVar[str]
    """The name the scoring node is drawn with."""

    def wire(self, graph: RefineBuilder) -> None:
        self.kit.add_model_node(graph, "sample_candidates", self.sample_candidates)
        self.kit.add_model_node(graph, self.score_node, self.score)
        graph.add_node("choose", self.choose)
        chain(graph, "sample_candidates", self.score_node, "choose")

    async def sample_candidates(
        self, state: Mapping[str, Any], runtime: Runtime[Context]
    ) -> Update:
        """N candidates for the step in one request: the paper discards the draft; with
        `reuse_draft` the draft (a sample from the same policy) is candidate 0."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        reused = [state["draft"]] if ctx.reuse_draft else []
        if ctx.num_candidates - len(reused) < 1:
            return {"candidates": reused}
        fmt = ctx.step_style
        messages = step_messages(state["question"], state.get("system_prompt"), texts, index, fmt)
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

    @abstractmethod
    async def score(self, state: Any, runtime: Runtime[Context]) -> Update:
        """Score every candidate (a node that asks a model)."""

    @abstractmethod
    async def choose(self, state: Any, runtime: Runtime[Context]) -> Update:
        """Keep one candidate, and write the strategy's record."""


@dataclass(frozen=True)
class Strategy:
    """A registry entry: the strategy's name, its scratch state (a `Scratch` with its own
    keys), its nodes, its record type, its description, and whether it asks the verifier (a
    strategy that does not leaves the verifier's server idle, so that server's speed does not
    bound how many questions a benchmark keeps in flight), and the extra it needs, if any."""

    name: str
    scratch: type
    nodes: type[StrategyNodes]
    record: type[RefineRecord]
    description: str
    uses_verifier: bool = True
    extra: str = ""
    """The install extra its nodes need beyond the base (nodes.extras), checked up front."""

    def build(self, kit: Kit) -> RefineGraph:
        """The strategy's subgraph over the kit's models, compiled as `refine_<name>`: its
        nodes over its scratch state, with the shared interface (the run's Context comes from
        the loop's graph, which mounts it)."""
        graph: RefineBuilder = StateGraph(
            self.scratch, input_schema=RefineInput, output_schema=RefineOutput
        )
        self.nodes(kit).wire(graph)
        return graph.compile(name=f"refine_{self.name}")

    def summarise(self, record: Mapping[str, Any]) -> str:
        return self.record.model_validate(record).summary()
