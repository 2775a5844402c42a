"""Each token counted once by LangChain's cost meters (issue 79, item 2): ChatMUR over the
fake vLLM server, its client a real ChatOpenAI, inside `get_usage_metadata_callback()`, with
the same handler passed as a callback, and beside a tracer that sums the LLM runs of a trace
as LangSmith's does. The totals equal the server's token counters, every token under the
served model's name (the backbone's runs report them; ChatMUR's own run reports none), while
the message ChatMUR returns carries the graph's usage. Called directly, streamed, as
`prompt | ChatMUR` in a LangGraph node (streamed too), and as `mur_tool` inside an agent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict
from uuid import UUID

import pytest
from examples import example
from langchain_core.callbacks import UsageMetadataCallbackHandler, get_usage_metadata_callback
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler
from langchain_core.tracers.schemas import Run
from langgraph.graph import END, START, StateGraph
from test_examples import ToolCaller

from asgi_server import running
from mur import ChatMUR
from mur.testing.fake_vllm import MODEL, FakeVLLM

SETTINGS = {"strategy": "critic", "gate": "always"}
"""Every step judged and revised: the backbone drafts, judges and revises (9 requests)."""
QUESTION = "What is 6 * 7?"


@dataclass(frozen=True)
class Server:
    fake: FakeVLLM
    url: str

    def counted(self) -> dict[str, int]:
        """The server's own token counters, as LangChain names them."""
        counters = self.fake.counters
        return {"input_tokens": counters.prompt_tokens, "output_tokens": counters.generation_tokens}


@pytest.fixture
def server() -> Iterator[Server]:
    fake = FakeVLLM(steps=3)
    with running(fake) as url:
        yield Server(fake, url)


def metered(meter: UsageMetadataCallbackHandler) -> dict[str, dict[str, int]]:
    """What the standard handler summed, by model name."""
    return {
        model: {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}
        for model, usage in meter.usage_metadata.items()
    }


def walk(run: Run) -> Iterator[Run]:
    yield run
    for child in run.child_runs:
        yield from walk(child)


def usages_of(run: Run) -> list[dict[str, int]]:
    """The usage_metadata of each generation a run put out (its outputs as a tracer keeps
    them: each message serialised, its fields under `kwargs`)."""
    return [
        generation["message"]["kwargs"]["usage_metadata"]
        for batch in (run.outputs or {}).get("generations", [])
        for generation in batch
        if (generation.get("message") or {}).get("kwargs", {}).get("usage_metadata")
    ]


def traced(tracer: RunCollectorCallbackHandler) -> tuple[dict[str, int], list[Run]]:
    """A trace's token totals as LangSmith's tracer sums them (LangChainTracer._on_llm_end:
    the usage_metadata of every generation of every LLM run), and the runs that reported."""
    totals = {"input_tokens": 0, "output_tokens": 0}
    reporting = []
    for root in tracer.traced_runs:
        for run in walk(root):
            usages = usages_of(run) if run.run_type == "llm" else []
            reporting += [run] if usages else []
            for usage in usages:
                totals["input_tokens"] += usage["input_tokens"]
                totals["output_tokens"] += usage["output_tokens"]
    return totals, reporting


def ancestors(run: Run, runs: dict[UUID, Run]) -> list[str]:
    """The names of the runs above `run`, nearest first."""
    names = []
    while run.parent_run_id is not None:
        run = runs[run.parent_run_id]
        names.append(run.name)
    return names


def assert_counted_once(
    server: Server, meters: list[UsageMetadataCallbackHandler], message: BaseMessage
) -> None:
    """Each meter holds the server's counters under the served model's name, and the message
    the app got holds the graph's usage, the same numbers."""
    assert server.fake.counters.generation_tokens > 0
    for meter in meters:
        assert metered(meter) == {MODEL: server.counted()}
    assert isinstance(message, AIMessage) and message.usage_metadata is not None
    usage = message.usage_metadata
    got = {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}
    assert got == server.counted()


async def test_a_direct_call_counts_each_token_once_under_the_served_model(
    server: Server,
) -> None:
    llm = ChatMUR(base_url=server.url, **SETTINGS)
    passed, tracer = UsageMetadataCallbackHandler(), RunCollectorCallbackHandler()
    with get_usage_metadata_callback() as meter:
        message = await llm.ainvoke(QUESTION, config={"callbacks": [passed, tracer]})
    assert_counted_once(server, [meter, passed], message)

    totals, reporting = traced(tracer)
    assert totals == server.counted()
    (root,) = tracer.traced_runs
    assert root.name == "ChatMUR" and root not in reporting  # its own run reports no usage
    assert len(reporting) == server.fake.counters.requests  # a run per request answered
    runs = {run.id: run for run in walk(root)}
    assert all("ChatMUR" in ancestors(run, runs) for run in reporting)  # beneath ChatMUR


async def test_a_streamed_call_counts_each_token_once(server: Server) -> None:
    """Streamed, the graph's runs are still beneath ChatMUR's run (BaseChatModel's astream
    would give them no parent) and the closing chunk carries the graph's usage."""
    llm = ChatMUR(base_url=server.url, **SETTINGS)
    passed, tracer = UsageMetadataCallbackHandler(), RunCollectorCallbackHandler()
    with get_usage_metadata_callback() as meter:
        chunks = [c async for c in llm.astream(QUESTION, {"callbacks": [passed, tracer]})]
    assert len(chunks) > 1 and all(chunk.usage_metadata is None for chunk in chunks[:-1])
    assert_counted_once(server, [meter, passed], sum(chunks[1:], chunks[0]))
    assert traced(tracer)[0] == server.counted()


@pytest.mark.parametrize("call", ["invoke", "stream"])
def test_a_sync_call_counts_each_token_once(server: Server, call: str) -> None:
    llm = ChatMUR(base_url=server.url, **SETTINGS)
    with get_usage_metadata_callback() as meter:
        if call == "invoke":
            message: BaseMessage = llm.invoke(QUESTION)
        else:
            chunks = list(llm.stream(QUESTION))
            message = sum(chunks[1:], chunks[0])
    assert_counted_once(server, [meter], message)


class Tutor(TypedDict, total=False):
    question: str
    reply: AIMessage


def tutor(llm: ChatMUR) -> Any:
    """The issue's app: a LangGraph graph whose node calls `prompt | ChatMUR`."""
    chain = ChatPromptTemplate.from_messages([("user", "{question}")]) | llm

    async def solve(state: Tutor) -> Tutor:
        return {"reply": await chain.ainvoke({"question": state["question"]})}

    builder = StateGraph(Tutor)
    builder.add_node("solve", solve)
    builder.add_edge(START, "solve")
    builder.add_edge("solve", END)
    return builder.compile()


@pytest.mark.parametrize("mode", ["invoke", "messages"])
async def test_a_langgraph_node_with_a_prompt_chain_counts_each_token_once(
    server: Server, mode: str
) -> None:
    """Run whole, or streamed in LangGraph's messages mode (with subgraphs): there ChatMUR's
    steps come as chunks that add up to its reply, and the backbone's requests stay plain
    requests whose replies are not streamed as messages of the app's (tagged `nostream`)."""
    app, tracer = tutor(ChatMUR(base_url=server.url, **SETTINGS)), RunCollectorCallbackHandler()
    config: Any = {"callbacks": [tracer]}
    streamed: list[tuple[BaseMessage, dict[str, Any]]] = []
    with get_usage_metadata_callback() as meter:
        if mode == "invoke":
            state = await app.ainvoke({"question": QUESTION}, config=config)
        else:
            modes = ["messages", "values"]
            parts = app.astream({"question": QUESTION}, config, stream_mode=modes, subgraphs=True)
            async for _, kind, part in parts:
                if kind == "values":
                    state = part
                else:
                    streamed.append(part)
            assert {meta["ls_provider"] for _, meta in streamed} == {"mur"}
            assert "".join(str(chunk.content) for chunk, _ in streamed) == state["reply"].content
    assert_counted_once(server, [meter], state["reply"])
    assert traced(tracer)[0] == server.counted()


async def test_mur_tool_inside_an_agent_counts_each_token_once(server: Server) -> None:
    """The agent's own model (scripted, no tokens) calls `mur_tool`: the meter holds MUR's
    tokens once, and the tool's account names the same number."""
    agent_example = example("agent")
    agent = agent_example.build_agent(ToolCaller(), ChatMUR(base_url=server.url, **SETTINGS))
    with get_usage_metadata_callback() as meter:
        _, used = await agent_example.ask(agent, QUESTION, server.url)
    assert metered(meter) == {MODEL: server.counted()}
    assert f"{server.fake.counters.generation_tokens} tokens generated" in used.content


async def test_best_of_n_counts_each_token_once(server: Server) -> None:
    """best-of-N asks for its N candidates in one request (n=N)."""
    llm = ChatMUR(base_url=server.url, strategy="best_of_n", gate="always")
    tracer = RunCollectorCallbackHandler()
    with get_usage_metadata_callback() as meter:
        message = await llm.ainvoke(QUESTION, config={"callbacks": [tracer]})
    assert traced(tracer)[0] == server.counted()
    assert_counted_once(server, [meter], message)
