"""BFCL's multi-turn function-calling cases, run by a LangChain `create_agent` agent whose model
calls MURMiddleware gates (issue 80): a small model calls the tools, a stronger one rewrites the
calls the gate flags. BFCL (bfcl-eval on PyPI) gives the cases, the APIs they call (simulated
in-process: a file system, a trading bot, a ticket system, ...) and the checker that compares
the APIs' states and replies after each turn with its ground truth's. Each case is one record
of a results folder (records.jsonl, resumable), so reports read it like any run.

bfcl-eval is installed without its dependencies (`make setup` runs `INSTALL`): its pins (numpy
1.26, networkx 3.3, a dozen provider SDKs) would change the project's environment, and what is
used here (the data, the simulated APIs, the multi-turn checker, the tool converters) imports
none of them but the tree-sitter parsers its handler module loads. BFCL writes its scratch
folders under `BFCL_PROJECT_ROOT`, set here to `<MUR_HOME>/bfcl` unless given.

A case's user turns are runs of one agent thread (a checkpointer keeps the conversation), and
the middleware's momentum spans the thread (`momentum_scope="thread"`): a case is one sequence
of model calls, as a question is one sequence of steps. A turn ends at the agent's first reply
without a tool call; a turn of more than BFCL's 20 tool-calling model calls ends the case,
failed, as BFCL force-quits it. A prompt longer than the model's context fails the case too
(`context_length`), as a BFCL entry whose inference errs.
"""

from __future__ import annotations

import importlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import Any, cast

import openai
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ModelCallLimitMiddleware,
    ModelRequest,
    ModelResponse,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolCall
from langchain_core.messages.tool import tool_call
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver

from mur.evals.harness.run_record import JobKey, RecordedUsage, RunRecord, make_record
from mur.integrations.middleware import MURMiddleware
from mur.servers.processes.paths import mur_home

BFCL_REQUIREMENT = "bfcl-eval==2026.3.23"
INSTALL = (
    f"pip install --no-deps {BFCL_REQUIREMENT} tree_sitter==0.21.3 tree-sitter-java==0.21.0 "
    "tree-sitter-javascript==0.21.4"
)
"""BFCL without its dependencies but the parsers its model-handler module imports at load (the
tool converters used here live there); `make setup` runs it."""
CATEGORIES = ("multi_turn_base", "multi_turn_miss_param", "multi_turn_miss_func")
"""BFCL's multi-turn categories that run offline and fit a 8k-token context (long_context's
file listings do not)."""
STEP_LIMIT = 20
"""BFCL's MAXIMUM_STEP_LIMIT: tool-calling model calls in one turn before the case fails."""
DATASET = "bfcl"
BACKBONE_ROLES = ("draft", "draw")
"""The middleware's call records whose tokens are the agent's model's; "escalation" calls are
the stronger model's (the external tokens, as MUR's escalate strategy counts them)."""


class BFCLMissingError(ImportError):
    """bfcl-eval is not installed: the one line says how to install it."""


BFCL_MODULES = {
    "utils": "bfcl_eval.utils",
    "prompts": "bfcl_eval.constants.default_prompts",
    "types": "bfcl_eval.constants.type_mappings",
    "enums": "bfcl_eval.constants.enums",
    "checker": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
    "execution": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils",
    "handler": "bfcl_eval.model_handler.utils",
}
"""The parts of bfcl-eval this runner uses, by the name it uses them under."""


@cache
def bfcl() -> dict[str, ModuleType]:
    """bfcl-eval's modules, imported once (BFCL's scratch folder set first)."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(mur_home() / "bfcl"))
    try:
        return {key: importlib.import_module(name) for key, name in BFCL_MODULES.items()}
    except ImportError as exc:
        raise BFCLMissingError(
            f"BFCL's cases and checker are not installed ({exc.name} is missing): {INSTALL}"
        ) from exc


@dataclass(frozen=True)
class Case:
    """One BFCL test entry, as its checker takes it, with its ground truth (per turn, the calls
    BFCL's authors made)."""

    entry: dict[str, Any]
    ground_truth: list[list[str]]

    @property
    def id(self) -> str:
        return str(self.entry["id"])

    @property
    def category(self) -> str:
        return self.id.rsplit("_", 1)[0]


def load_cases(category: str, offset: int = 0, limit: int | None = None) -> list[Case]:
    """The category's cases in BFCL's order, `limit` of them from `offset`."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}: one of {', '.join(CATEGORIES)}")
    utils = bfcl()["utils"]
    truths = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry(category)}
    entries = utils.load_dataset_entry(category)
    picked = entries[offset : None if limit is None else offset + limit]
    return [Case(entry, truths[entry["id"]]) for entry in picked]


class Simulation:
    """A case's APIs as BFCL simulates them, from its initial state. BFCL keeps the instances in
    a module-level table by name: each Simulation (an attempt at a case, or a check) has its
    own name, so a retried case starts afresh and concurrent cases never share one."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.name = f"mur_{uuid.uuid4().hex}"

    def execute(self, calls: Sequence[str]) -> list[str]:
        """Run calls written as BFCL writes them (`cd(folder='document')`); their results."""
        entry = self.case.entry
        results, _ = bfcl()["execution"].execute_multi_turn_func_call(
            list(calls),
            entry["initial_config"],
            entry["involved_classes"],
            self.name,
            self.case.id,
            long_context="long_context" in self.case.category,
            is_evaL_run=False,
        )
        return [str(result) for result in results]


def call_strings(message: AIMessage) -> list[str]:
    """A reply's tool calls as BFCL writes them (its own converter)."""
    calls = [{call["name"]: call["args"]} for call in message.tool_calls]
    return list(bfcl()["handler"].convert_to_function_call(calls)) if calls else []


def case_tools(functions: Sequence[dict[str, Any]], simulation: Simulation) -> list[BaseTool]:
    """BFCL's function documents as LangChain tools whose calls run in the simulation: the
    schemas as BFCL gives an OpenAI-style model (its converter), the arguments as the model
    wrote them (BFCL's checker judges their types, as it does for any model)."""
    modules = bfcl()
    specs = modules["handler"].convert_to_tool(
        list(functions),
        modules["types"].GORILLA_TO_OPENAPI,
        modules["enums"].ModelStyle.OPENAI_COMPLETIONS,
    )

    def runner(name: str) -> Callable[..., str]:
        def run(**arguments: Any) -> str:
            call = {name: arguments}
            [result] = simulation.execute(modules["handler"].convert_to_function_call([call]))
            return result

        return run

    def in_loop(name: str) -> Callable[..., Awaitable[str]]:
        """The same call on the event loop: BFCL's APIs are instant, and its instance table
        is safer from one thread."""
        run = runner(name)

        async def arun(**arguments: Any) -> str:
            return run(**arguments)

        return arun

    tools: list[BaseTool] = []
    for spec in specs:
        function = spec.get("function", spec)
        tools.append(
            StructuredTool(
                name=function["name"],
                description=function.get("description", ""),
                args_schema=function["parameters"],
                func=runner(function["name"]),
                coroutine=in_loop(function["name"]),
            )
        )
    return tools


def written_calls(text: str, tools: Collection[str]) -> list[ToolCall]:
    """The tool calls a reply wrote as JSON in its text (`{"name": ..., "arguments": {...}}`,
    alone, in a list or in a ```json block) instead of the `<tool_call>` tags vLLM's hermes
    parser reads: Qwen2.5-Coder 0.5B and 1.5B write them so under the Qwen template that asks
    for the tags. Only objects naming one of `tools` count."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    index = 0
    while (start := _next_json(text, index)) >= 0:
        try:
            value, index = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        found += value if isinstance(value, list) else [value]
    calls = []
    for value in found:
        if not isinstance(value, dict) or value.get("name") not in tools:
            continue
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                continue
        if isinstance(arguments, dict):
            calls.append(
                tool_call(name=value["name"], args=arguments, id=f"call_{uuid.uuid4().hex[:12]}")
            )
    return calls


def _next_json(text: str, start: int) -> int:
    positions = [p for p in (text.find("{", start), text.find("[", start)) if p >= 0]
    return min(positions, default=-1)


class WrittenToolCalls(AgentMiddleware[AgentState[Any], Any, Any]):
    """Turns tool calls a reply wrote as JSON text into the reply's tool calls (what the
    server's parser would have made of `<tool_call>` tags), so the agent runs them as BFCL's
    prompt-mode handlers run a model's written calls. Placed after MURMiddleware, it sees each
    reply (draft, escalation, draw) before the gate compares them; the logprobs stay the
    reply's."""

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        response = await handler(request)
        names = {getattr(tool, "name", "") for tool in request.tools}
        result = []
        for message in response.result:
            if isinstance(message, AIMessage) and not message.tool_calls:
                calls = written_calls(message.text, names)
                if calls:
                    message = message.model_copy(update={"tool_calls": calls})
            result.append(message)
        return ModelResponse(result, response.structured_response)


@dataclass
class CaseRun:
    """What an agent did on a case: per turn, its tool-calling replies' calls; every model
    call's record (the middleware's); why it ended."""

    turns: list[list[list[str]]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "answer"


def _context_overflow(exc: openai.BadRequestError) -> bool:
    text = str(exc).lower()
    return "context length" in text or "maximum context" in text or "too long" in text


def _turn_messages(case: Case, index: int, functions: list[dict[str, Any]]) -> list[Any]:
    """A turn's user messages; a turn that brings BFCL's held-out functions (miss_func) adds
    them to `functions` and says so, with BFCL's own words."""
    held_out = case.entry.get("missed_function", {}).get(str(index))
    if held_out:
        functions.extend(held_out)
        return [("user", bfcl()["prompts"].DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)]
    return list(case.entry["question"][index])


async def run_case(case: Case, model: BaseChatModel, middleware: MURMiddleware) -> CaseRun:
    """The case's turns, in order, on one agent thread. A server error other than a prompt
    too long for the model is raised (the case is not recorded, and a rerun tries it again)."""
    simulation = Simulation(case)
    saver = InMemorySaver()
    # a model call is up to five graph steps (two before_model hooks, the model, the tools)
    config: RunnableConfig = {
        "configurable": {"thread_id": case.id},
        "recursion_limit": 6 * (STEP_LIMIT + 2),
    }
    stack: list[AgentMiddleware[Any, Any, Any]] = [
        middleware,
        ModelCallLimitMiddleware(run_limit=STEP_LIMIT + 1, exit_behavior="end"),
        WrittenToolCalls(),
    ]
    functions = list(case.entry["function"])
    done = CaseRun()
    seen = 0
    for index in range(len(case.entry["question"])):
        messages = _turn_messages(case, index, functions)
        agent = create_agent(
            model,
            case_tools(functions, simulation),
            middleware=stack,
            checkpointer=saver,
        )
        try:
            state = await agent.ainvoke(cast(Any, {"messages": messages}), config)
        except openai.BadRequestError as exc:
            if not _context_overflow(exc):
                raise
            done.finish_reason = "context_length"
            return done
        new: list[AnyMessage] = state["messages"][seen:]
        seen = len(state["messages"])
        replies = [m for m in new if isinstance(m, AIMessage) and "mur" in m.response_metadata]
        done.calls += [reply.response_metadata["mur"] for reply in replies]
        done.turns.append([calls for calls in map(call_strings, replies) if calls])
        if len(replies) > STEP_LIMIT and replies[-1].tool_calls:
            done.finish_reason = "max_steps"
            return done
    return done


def check(case: Case, run: CaseRun) -> tuple[bool, str]:
    """BFCL's verdict on the run: valid or not, and its error type ("" when valid). A run cut
    short (fewer turns than the case) fails, as BFCL fails a force-terminated entry."""
    if len(run.turns) != len(case.ground_truth):
        return False, f"multi_turn:{run.finish_reason}"
    verdict = bfcl()["checker"].multi_turn_checker(
        run.turns, case.ground_truth, case.entry, case.category, Simulation(case).name
    )
    return bool(verdict["valid"]), "" if verdict["valid"] else str(verdict.get("error_type"))


def usage_of(calls: Sequence[dict[str, Any]]) -> RecordedUsage:
    """Tokens of each model over every call the middleware made (drafts, escalations, draws)."""
    usage = RecordedUsage(
        backbone_tokens=0,
        external_tokens=0,
        backbone_prompt_tokens=0,
        external_prompt_tokens=0,
        llm_calls=0,
    )
    for record in calls:
        for call in record["calls"]:
            side = "backbone" if call["role"] in BACKBONE_ROLES else "external"
            usage[f"{side}_tokens"] += call["output_tokens"]  # type: ignore[literal-required]
            usage[f"{side}_prompt_tokens"] += call["input_tokens"]  # type: ignore[literal-required]
            usage["llm_calls"] += 1
    return usage


def case_record(
    key: JobKey, case: Case, run: CaseRun, latency_s: float, settings: dict[str, Any]
) -> RunRecord:
    """One line of records.jsonl: the verdict, each model's tokens, the calls the gate saw
    (`steps`, each with `scaled` when it was acted on) and, as the answer, what the agent
    called in each turn."""
    valid, error = check(case, run)
    steps = [{**call, "scaled": call["action"] in ("escalated", "voted")} for call in run.calls]
    trace = {
        "answer": json.dumps(run.turns),
        "finish_reason": run.finish_reason,
        "steps": steps,
        "usage": usage_of(run.calls),
        "fallback": None,
        "config": settings,
        "check": error,
    }
    return make_record(key, json.dumps(case.ground_truth), trace, valid, latency_s)
