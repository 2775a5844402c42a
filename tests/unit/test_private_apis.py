"""The private parts of dependencies the project still relies on, each behind one adapter:
these tests fail when an upgrade changes them, before a user's request or run does.

- langchain-openai's translation of SDK errors (servers/clients/stock_errors.py);
- langchain-core's `var_child_runnable_config`, where LangGraph finds its parent run
  (integrations/chat_model.py, `without_parent_run`);
- langgraph-checkpoint-postgres's `_cursor`, through which its saver runs every statement
  (persistence/postgres.py, `JoiningPostgresSaver`; pinned to the tested minor series).
"""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path
from typing import TypedDict

import httpx
import openai
import pytest
from langchain_core.exceptions import ContextOverflowError, ModelNotFoundError
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from packaging.requirements import Requirement

from mur.integrations.chat_model import without_parent_run
from mur.servers.clients.stock_errors import raise_as_stock

ROOT = Path(__file__).resolve().parents[2]
REQUEST = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def status_error(kind: type[openai.APIStatusError], status: int, message: str) -> Exception:
    response = httpx.Response(status, request=REQUEST, json={"error": {"message": message}})
    return kind(message, response=response, body={"message": message})


@pytest.mark.parametrize(
    ("error", "langchain_class"),
    [
        (
            status_error(openai.BadRequestError, 400, "context_length_exceeded: 9000 > 8192"),
            ContextOverflowError,
        ),
        (status_error(openai.NotFoundError, 404, "model x does not exist"), ModelNotFoundError),
    ],
)
def test_sdk_errors_are_raised_as_the_stock_chat_model_raises_them(
    error: openai.APIStatusError, langchain_class: type[Exception]
) -> None:
    """LangChain's class, still the SDK's (code catching either keeps working)."""
    with pytest.raises(langchain_class) as raised:
        raise_as_stock(error)
    assert isinstance(raised.value, type(error)) and raised.value.__cause__ is error


def test_an_error_without_a_langchain_class_is_raised_as_it_is() -> None:
    error = status_error(openai.UnprocessableEntityError, 422, "bad")
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        raise_as_stock(error)
    assert raised.value is error


class Seen(TypedDict, total=False):
    inner: str


async def test_langgraph_finds_its_parent_run_where_without_parent_run_clears_it() -> None:
    """Inside a node, the node's config is in `var_child_runnable_config` (a graph invoked
    there would be the node's subgraph); in `without_parent_run()` it is not."""
    seen: dict[str, object] = {}

    async def node(state: Seen) -> Seen:
        seen["inside"] = var_child_runnable_config.get()
        seen["detached"] = without_parent_run().run(var_child_runnable_config.get)
        return {}

    graph = StateGraph(Seen)
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    graph.add_edge("node", END)
    await graph.compile().ainvoke({}, {"configurable": {"thread_id": "t"}})
    inside = seen["inside"]
    assert isinstance(inside, dict) and inside["configurable"]["thread_id"] == "t"
    assert seen["detached"] is None


def test_the_postgres_saver_runs_its_statements_through_cursor() -> None:
    """JoiningPostgresSaver overrides `_cursor` to put the saver's writes in the caller's
    transaction: the saver must still open every cursor there, with the same signature."""
    signature = inspect.signature(AsyncPostgresSaver._cursor)
    assert list(signature.parameters) == ["self", "pipeline"]
    assert signature.parameters["pipeline"].kind is inspect.Parameter.KEYWORD_ONLY
    for method in ("aput", "aput_writes", "alist", "adelete_thread"):
        source = inspect.getsource(getattr(AsyncPostgresSaver, method))
        assert "self._cursor(" in source, f"AsyncPostgresSaver.{method} no longer uses _cursor"


def test_the_postgres_saver_is_pinned_to_the_tested_minor_series() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (line,) = [
        line
        for line in project["optional-dependencies"]["serve"]
        if Requirement(line).name == "langgraph-checkpoint-postgres"
    ]
    assert str(Requirement(line).specifier) == "<3.3,>=3.2"
