"""How every node that asks a model behaves when a request fails, declared in one place.

`ModelCalls.add` puts such a node (draft_step, ask_answer, each strategy's inner nodes) in its
graph with:
- LangGraph's RetryPolicy `MODEL_RETRY` for transient server faults: the only retry loop (the
  clients' own retries are off, servers.clients.chat_models);
- every attempt's tokens counted, failed attempts included (`AttemptLedger`);
- a request that no longer fits the model's context turned into the node's `on_overflow`
  outcome, which ends the solution instead of failing it.

What a fault is (transient, a full context) is the client layer's to say
(servers.clients.transport_errors); the graph receives it as LangGraph receives `retry_on`.

Not declared with LangGraph 1.2's other failure settings, and why: a node `error_handler`
catches every final failure, and one that re-raises leaves the task marked handled in the
checkpoint, so a resumed thread would never run the node again; a node `TimeoutPolicy` is
static, while each request's timeout follows its own max_tokens (servers.clients.chat_models).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from langgraph.graph import StateGraph
from langgraph.types import RetryPolicy
from langgraph.typing import ContextT

from mur.graphs.attempts import AttemptLedger, Node, Outcome
from mur.nodes.llm import MissingLogprobsError
from mur.servers.clients.chat_models import base_url_of
from mur.servers.clients.transport_errors import (
    ContextOverflow,
    context_overflow,
    describe_transport_error,
    is_transient,
)

# Transient server faults (connection resets, 5xx, timeouts, a reply that is no chat completion:
# a gateway's error page may pass) are retried; anything else (bad request, missing logprobs)
# fails at once with its own message.
MODEL_RETRY = RetryPolicy(
    max_attempts=3,
    initial_interval=1.0,
    backoff_factor=2.0,
    max_interval=30.0,
    retry_on=is_transient,
)

OnOverflow = Callable[[Any, ContextOverflow], Outcome]
"""A node's outcome when its request does not fit the context: (state, overflow) -> update."""


class ModelCalls:
    """Adds model-calling nodes to the graphs of one compiled graph, sharing one ledger."""

    def __init__(
        self,
        retry: RetryPolicy = MODEL_RETRY,
        overflow_of: Callable[[BaseException], ContextOverflow | None] = context_overflow,
    ) -> None:
        self.retry = retry
        self.ledger = AttemptLedger(retry)
        self.overflow_of = overflow_of

    def add(
        self,
        graph: StateGraph[Any, ContextT, Any, Any],
        name: str,
        node: Node[ContextT],
        on_overflow: OnOverflow,
    ) -> None:
        """Add `node` as `name`: retried, counted, and ended by `on_overflow` on a full
        context."""

        def on_failure(state: Any, exc: Exception) -> Outcome | None:
            overflow = self.overflow_of(exc)
            return on_overflow(state, overflow) if overflow is not None else None

        graph.add_node(name, self.ledger.counted(node, on_failure), retry_policy=self.retry)


def server_roles(backbone: Any, verifier: Any) -> dict[str, str]:
    """Base URL -> "backbone" / "verifier" of a run's models, for `describe_failure` (a URL
    both use is named as the backbone; a model without a URL, a fake, is left out)."""
    roles: dict[str, str] = {}
    for role, model in (("verifier", verifier), ("backbone", backbone)):
        url = base_url_of(model)
        if url:
            roles[url] = role
    return roles


def describe_failure(
    exc: BaseException, roles: Mapping[str, str] | None = None, hint: str | None = None
) -> str:
    """One line for a run that failed: a model server that could not be reached, did not
    answer in time, answered an error or sent back no chat completion is named (its role by
    `roles`, base URL -> role, else its URL) with what came back and what the graph's retries
    did (servers.clients.transport_errors words it); `hint` says what to check when a server is
    unreachable. Other errors say what they are. The CLI, the endpoint's 502 and the evaluation
    runner's failure reason are this line."""
    said = describe_transport_error(exc, MODEL_RETRY.max_attempts, roles, hint)
    if said is not None:
        return said
    if isinstance(exc, MissingLogprobsError | ValueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
