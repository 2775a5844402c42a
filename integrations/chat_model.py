"""MUR as a LangChain chat model (`ChatMUR`) and as a tool an agent calls (`mur_tool`).

`ChatMUR` goes where an app's chat model was (`prompt | llm | parser`, `astream`, batch,
callbacks and LangSmith): it answers the conversation's last user message (the system prompt
from its last system message, as the endpoint reads one) with the MUR graph, in this process,
over an injected backbone (and verifier) chat model, or clients of `base_url`, or of the
servers the environment names. Every graph setting is a keyword (`strategy`, `gate`, `gamma`,
`traces`, ...), validated as Context validates it, or named as the endpoint names them
(`model="mur-critic-never"`), and may be given again per call (`llm.invoke(q, gamma=0.8)`,
`llm.bind(traces=8)`).

Its message is the endpoint's reply (integrations/chat.py writes both): the content is the kept
steps and the fallback, `usage_metadata` the graph's usage (backbone + external tokens, equal
to the servers' counters), `response_metadata` the answer, finish reason, steps (uncertainty,
momentum, scaled) and traces, and `mur` the whole trace (the endpoint's `mur`). Streamed, each
kept step is a chunk as it is kept, its event (numbers included) in the chunk's
`response_metadata["mur_steps"]` as `[{"kept": event}]` (wrapped: LangChain merges list
entries that carry an `index`), then a closing chunk with the rest of the content, the usage
and the same metadata as `invoke`'s. The chunks come from the run of `ainvoke`, which also
hands them to its callbacks as new tokens (LangGraph's messages mode, astream_events): unlike
BaseChatModel's own streaming, which gives `_astream` no run manager, that keeps the graph's
runs beneath this model's run.

Each token is counted once by LangChain's meters. The backbone's and verifier's calls run
beneath this model's run as chat-model runs of their own, and each reports its tokens under
its served model's name, as every LangChain model call does; LangChain's configure hooks
(`get_usage_metadata_callback`, LangSmith's tracer) reach those runs whatever callbacks they
are given, so they cannot be kept from reporting. This model's own run is the orchestration
above them, like a chain's: the result its callbacks see carries no `usage_metadata`, and
`invoke`, `ainvoke`, `stream`, `astream` (and what calls them: batch, chains, tools) give the
caller a copy of the message with the graph's usage (`with_usage`). `generate`/`agenerate`
return what the callbacks saw; the graph's usage is then in `response_metadata["mur"]`.

What it cannot do it refuses in one line: tools (MUR produces no tool calls: give MUR to the
agent as `mur_tool` instead), structured output, stop sequences, a conversation without a user
message.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import LC_ID_PREFIX, AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.constants import TAG_NOSTREAM
from pydantic import ConfigDict, Field, PrivateAttr

from mur.graphs.mur import build_graph
from mur.graphs.solve import Solution, StepEvent, solve
from mur.graphs.state import Context
from mur.integrations.chat import (
    MODELS,
    closing_text,
    content_of,
    model_name,
    question_of,
    streamed_line,
    trace_of,
)
from mur.integrations.chat import usage_of as openai_usage
from mur.servers.clients.chat_models import make_chat_model

ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
NO_TOOLS = (
    "ChatMUR produces no tool calls: bind the tools to the agent's own chat model and give it "
    "MUR as one of them (mur.mur_tool)"
)
NO_SCHEMA = (
    "ChatMUR answers in free text (the reasoning, then the answer) and cannot honour a schema: "
    "read response_metadata['answer'], or put a structured-output model after it"
)
M = TypeVar("M", bound=BaseMessage)
LLMRunManager = AsyncCallbackManagerForLLMRun | CallbackManagerForLLMRun


def without_parent_run() -> contextvars.Context:
    """A copy of the current context in which no LangChain run is in progress.

    LangGraph finds the run it is nested in through langchain-core's `var_child_runnable_config`
    (no public way to clear it exists): this is the one place the project sets it.
    tests/unit/test_private_apis.py fails if LangGraph stops reading it there, and
    pyproject.toml bounds langchain-core and langgraph to the major versions it ran on.
    """
    context = contextvars.copy_context()
    context.run(var_child_runnable_config.set, None)
    return context


STEP_SINK: contextvars.ContextVar[Callable[[AIMessageChunk], None] | None] = contextvars.ContextVar(
    "mur_step_sink", default=None
)
"""Where a ChatMUR call also sends each kept step's chunk: set by `astream` in the context of
the one call it makes, so no other call's steps reach it."""


class ChatMUR(BaseChatModel):
    """The MUR graph as a LangChain chat model; see the module's docstring.

    `ChatMUR(backbone=llm, strategy="critic", gamma=0.9)`, `ChatMUR(base_url=URL)`, or
    `ChatMUR()` for the servers MUR_BASE_URL names. Settings are Context's fields."""

    backbone: BaseChatModel | None = Field(default=None, exclude=True)
    """The chat model that drafts the steps (any LangChain chat model returning OpenAI-format
    token logprobs); None: a client of `base_url`, else of the servers the environment names."""
    verifier: BaseChatModel | None = Field(default=None, exclude=True)
    """The critic's and best-of-N's judge; None: the backbone (or a client of verifier_url)."""
    base_url: str | None = None
    """An OpenAI-compatible vLLM server for the backbone (and verifier), when none is given."""
    backbone_model: str | None = None
    """The served model's name at `base_url` (None: ask the server)."""
    verifier_url: str | None = None
    verifier_model: str | None = None
    context: Context = Field(default_factory=Context)
    """The graph's settings; give them as keywords (`strategy=`, `gamma=`, ...)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _graph: Any = PrivateAttr(default=None)

    def __init__(self, **given: Any) -> None:
        """Context's fields given as keywords join `context`, checked as Context checks them:
        a bad setting raises ContextError in one line naming it."""
        settings = settings_of(given)
        base = given.pop("context", None)
        base_settings = base.as_dict() if isinstance(base, Context) else dict(base or {})
        given["context"] = Context(**{**base_settings, **settings})
        super().__init__(**given)

    @property
    def _llm_type(self) -> str:
        return "mur"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name(), **self.context.as_dict()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """What LangSmith records of a call: provider mur, the endpoint's model name."""
        name = kwargs.get("model") or self.model_name()
        return LangSmithParams(ls_provider="mur", ls_model_name=name, ls_model_type="chat")

    def model_name(self, context: Context | None = None) -> str:
        """The endpoint's name for these settings: `mur-<strategy>` (gate mur), else with the
        gate (`mur-critic-never`)."""
        chosen = context or self.context
        return model_name(chosen.strategy, chosen.gate)

    def graph(self) -> Any:
        """The compiled graph over this model's backbone and verifier (built once)."""
        if self._graph is None:
            backbone, verifier = self.backbone, self.verifier
            if backbone is None and self.base_url is not None:
                backbone = make_chat_model(self.base_url, self.backbone_model)
            if verifier is None and (self.verifier_url or self.verifier_model):
                url = self.verifier_url or self.base_url
                if url is None:
                    raise ValueError("ChatMUR: verifier_model needs verifier_url or base_url")
                verifier = make_chat_model(url, self.verifier_model)
            self._graph = build_graph(backbone=backbone, verifier=verifier)
        return self._graph

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        raise NotImplementedError(NO_TOOLS)

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(NO_SCHEMA)

    def _settings(self, stop: list[str] | None, overrides: dict[str, Any]) -> Context:
        """This call's Context: the model's, with the call's settings (`invoke(q, gamma=.8)`)."""
        if stop:
            raise ValueError(f"ChatMUR takes no stop sequences (got {stop!r}): a step ends itself")
        settings = settings_of(dict(overrides))
        unknown = [name for name in overrides if name not in settings and name != "model"]
        if unknown:
            raise ValueError(
                f"ChatMUR: unknown setting {unknown[0]!r}: give a model name or Context's "
                f"fields ({', '.join(Context.model_fields)})"
            )
        return Context(**{**self.context.as_dict(), **settings}) if settings else self.context

    async def _solve(
        self,
        messages: list[BaseMessage],
        context: Context,
        callbacks: Any,
        on_step: Callable[[StepEvent], None] | None = None,
    ) -> Solution:
        question, system = question_of((ROLES.get(m.type, m.type), m.content) for m in messages)
        config = {"callbacks": callbacks} if callbacks is not None else None
        run = solve(
            self.graph(),
            question,
            system_prompt=system,
            context=context,
            config=config,  # type: ignore[arg-type]
            on_step=on_step,
        )
        # A run of its own, also inside another graph's node (an agent's tool): LangGraph
        # would otherwise take the caller's config from the context and run MUR as its
        # subgraph (its values under the caller's namespace, its state in the caller's
        # checkpoints). The callbacks above keep it beneath the caller's run for tracers.
        detached = without_parent_run()
        detached.run(STEP_SINK.set, None)
        return await asyncio.create_task(run, context=detached)

    async def _reply(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: LLMRunManager | None,
        kwargs: dict[str, Any],
    ) -> ChatResult:
        """The graph's answer. Each kept step goes, as it is kept, to the run's callbacks as a
        new token (LangGraph's messages mode and astream_events stream it) and to `astream`'s
        caller (STEP_SINK), then a closing chunk with the rest of the content and the metadata.
        No usage_metadata: the backbone's runs beneath this one report those tokens (the
        module's docstring)."""
        context = self._settings(stop, kwargs)
        sink = STEP_SINK.get()
        reply_id = f"{LC_ID_PREFIX}-{run_manager.run_id}" if run_manager is not None else None

        async def tell(chunk: AIMessageChunk) -> None:
            if run_manager is not None:
                await _new_token(run_manager, chunk)
            if sink is not None:
                sink(chunk)

        kept: asyncio.Queue[StepEvent | None] = asyncio.Queue()
        child = child_callbacks(run_manager)
        run = asyncio.create_task(self._solve(messages, context, child, kept.put_nowait))
        run.add_done_callback(lambda _: kept.put_nowait(None))
        try:
            while (step := await kept.get()) is not None:
                steps = {"mur_steps": [{"kept": step}]}
                line = streamed_line(step, context)
                await tell(AIMessageChunk(content=line, response_metadata=steps, id=reply_id))
            trace = trace_of((await run).output)
        finally:
            run.cancel()
        metadata = self._metadata(trace, context)
        closing = closing_text(trace, context)
        await tell(
            AIMessageChunk(
                content=closing, response_metadata=metadata, id=reply_id, chunk_position="last"
            )
        )
        message = AIMessage(content=content_of(trace), response_metadata=metadata, id=reply_id)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await self._reply(messages, stop, run_manager, kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """The sync call runs the async graph on a loop of its own (the graph's nodes are
        async); inside a running loop, call `ainvoke`."""
        result: ChatResult = _run_sync(self._reply(messages, stop, run_manager, kwargs))
        return result

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """BaseChatModel's, the caller's message with the graph's usage (`with_usage`)."""
        return with_usage(super().invoke(input, config, stop=stop, **kwargs))

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """BaseChatModel's, the caller's message with the graph's usage (`with_usage`)."""
        return with_usage(await super().ainvoke(input, config, stop=stop, **kwargs))

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """Each kept step as a chunk as soon as it is kept, then a closing chunk with the rest
        of the content, the graph's usage and `invoke`'s metadata. The chunks are those of
        `ainvoke`'s run: BaseChatModel's astream hands `_astream` no run manager, so the
        graph's runs would fall outside the caller's trace. Closing the stream cancels it."""
        chunks: asyncio.Queue[AIMessageChunk | None] = asyncio.Queue()
        scope = contextvars.copy_context()  # this call's chunks only reach this stream
        scope.run(STEP_SINK.set, chunks.put_nowait)
        call = asyncio.create_task(self.ainvoke(input, config, stop=stop, **kwargs), context=scope)
        call.add_done_callback(lambda _: chunks.put_nowait(None))
        closing = None
        try:
            while (chunk := await chunks.get()) is not None:
                if chunk.chunk_position == "last":
                    closing = chunk  # given once the call has ended well
                else:
                    yield chunk
            message = await call
        finally:
            call.cancel()
        if closing is None:  # no graph ran (LangChain's cache answered): the whole reply
            metadata, at = message.response_metadata, message.id
            closing = AIMessageChunk(content=message.content, response_metadata=metadata, id=at)
        yield with_usage(closing)

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        """Sync streaming collects `astream` on a loop of its own: the steps come at once at
        the end; use `astream` to see them as they are kept."""
        chunks: list[AIMessageChunk] = _run_sync(
            _collect(self.astream(input, config, stop=stop, **kwargs))
        )
        yield from chunks

    def _metadata(self, trace: dict[str, Any], context: Context) -> dict[str, Any]:
        """The answer, finish reason, kept steps (uncertainty, momentum, scaled), traces and
        the whole trace."""
        return {
            "model_name": self.model_name(context),
            "answer": trace.get("answer"),
            "finish_reason": trace.get("finish_reason"),
            "steps": trace.get("steps") or [],
            "traces": trace.get("traces") or [],
            "mur": trace,
        }


def settings_of(given: dict[str, Any]) -> dict[str, Any]:
    """The Context settings among keywords, taken out of `given`: Context's fields, and a
    `model` name (`mur-critic`, `mur-best_of_n-always`: MODELS) as its strategy and gate.
    ValueError for a model name MUR does not know."""
    settings = {name: given.pop(name) for name in list(given) if name in Context.model_fields}
    name = given.pop("model", None)
    if name is not None:
        if name not in MODELS:
            raise ValueError(
                f"ChatMUR: unknown model {name!r}: mur-<strategy>[-<gate>], e.g. mur-critic, "
                "mur-best_of_n-always (the endpoint's GET /v1/models lists them)"
            )
        strategy, gate = MODELS[name]
        settings = {**settings, "strategy": strategy, "gate": gate}
    return settings


def child_callbacks(run_manager: LLMRunManager | None) -> Any:
    """Callbacks for the graph's run beneath this chat model's run (what a chain's run
    manager's `get_child` gives; an LLM run's has none): its inheritable handlers, tags and
    metadata, the run as parent. So a tracer (LangSmith) and a token meter see one run with
    the graph, its nodes and the backbone's calls beneath it. Tagged `nostream` (LangGraph's
    TAG_NOSTREAM): an app streaming LangGraph's messages gets this model's steps, not the
    backbone's raw replies as messages of their own."""
    if run_manager is None:
        return None
    child = AsyncCallbackManager(handlers=[], parent_run_id=run_manager.run_id)
    child.set_handlers(run_manager.inheritable_handlers)
    child.add_tags([*run_manager.inheritable_tags, TAG_NOSTREAM])
    child.add_metadata(run_manager.inheritable_metadata)
    return child


def usage_metadata(trace: dict[str, Any]) -> UsageMetadata:
    """The graph's usage as LangChain counts it (the endpoint's `usage`, integrations/chat.py)."""
    usage = openai_usage(trace.get("usage") or {})
    return UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )


def with_usage(message: M) -> M:
    """A ChatMUR reply with the graph's usage as its `usage_metadata`, for the caller.

    A copy: the message the run's callbacks saw keeps none, so a token meter or a tracer that
    sums the chat-model runs of a trace counts the tokens once, from the backbone's runs (each
    under its served model's name, which prices them). A message without MUR's trace (a step
    chunk) is returned as it is."""
    trace = message.response_metadata.get("mur")
    if not isinstance(message, AIMessage) or not isinstance(trace, dict):
        return message
    return message.model_copy(update={"usage_metadata": usage_metadata(trace)})


async def _collect(stream: AsyncIterator[AIMessageChunk]) -> list[AIMessageChunk]:
    return [chunk async for chunk in stream]


async def _new_token(run_manager: LLMRunManager, chunk: AIMessageChunk) -> None:
    """Tell the run's callbacks of a chunk as a streaming model tells them of a token (a sync
    run's manager calls its handlers at once)."""
    text = chunk.content if isinstance(chunk.content, str) else ""
    told = run_manager.on_llm_new_token(text, chunk=ChatGenerationChunk(message=chunk))
    if inspect.isawaitable(told):
        await told


def _run_sync(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise RuntimeError("ChatMUR: inside a running event loop, call ainvoke / astream")


def account(trace: dict[str, Any]) -> str:
    """A tool's short account of a solution: the answer, then steps, scaled steps, tokens."""
    steps = trace.get("steps") or []
    scaled = sum(1 for step in steps if step.get("scaled"))
    tokens = usage_metadata(trace)["output_tokens"]
    answer = trace.get("answer")
    said = answer if answer is not None else "(no answer: the solution did not finish)"
    return f"answer: {said}\n{len(steps)} steps, {scaled} scaled by MUR, {tokens} tokens generated"


def mur_tool(
    llm: ChatMUR | None = None,
    *,
    name: str = "mur_reason",
    description: str = (
        "Solve a math or reasoning question step by step with MUR, spending extra compute on "
        "the uncertain steps. Give the whole question; returns the answer and a short account."
    ),
    **settings: Any,
) -> BaseTool:
    """MUR as a tool a tool-calling agent calls with a question: the answer and a short
    account as its content, the whole trace as its artifact. `llm` (else `ChatMUR(**settings)`)
    solves it. Any failure (a bad question, a server down) comes back to the agent as the
    tool's error message, never as an exception through the agent."""
    chat = llm if llm is not None else ChatMUR(**settings)

    async def reason(question: str) -> tuple[str, dict[str, Any]]:
        try:
            reply = await chat.ainvoke(question)
        except Exception as exc:
            raise ToolException(f"{name} failed: {exc}") from exc
        trace = reply.response_metadata["mur"]
        return account(trace), trace

    return StructuredTool.from_function(
        coroutine=reason,
        name=name,
        description=description,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )
