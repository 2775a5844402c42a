"""Every attempt of a model-calling node counts: what the server answered and what failed.

The graph's RetryPolicy (graphs.model_calls.MODEL_RETRY) is the one retry loop: a node whose
request fails runs again from the start. Without help, the tokens of requests the server had
already answered in the failed attempt (the sibling candidates of a gather, the first of
several choices topped up) would vanish from the usage although the server spent them. So each
attempt runs under a `CallMeter` (nodes.usage); a failed attempt's count is kept under the
node's task id and added to the usage of the attempt that succeeds, with every request that
got no usable answer counted as `failed_calls`. A failure the node turns into an outcome (a
full context ends the solution) carries the count of its own attempt and of those before it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from langgraph.runtime import Runtime
from langgraph.types import Command, RetryPolicy
from langgraph.typing import ContextT

from mur.nodes.usage import Usage, add_usage, metered

Update = dict[str, Any]
Outcome = Update | Command[str]


class Node(Protocol[ContextT]):
    """A node that asks a model, over a graph whose run context is `ContextT`."""

    def __call__(self, state: Any, runtime: Runtime[ContextT]) -> Awaitable[Outcome]: ...


OnFailure = Callable[[Any, Exception], Outcome | None]
"""What a node makes of its own failure: an outcome, or None to let it fail (and be retried)."""


class AttemptLedger:
    """Usage of failed attempts, per node task, until an attempt of that task succeeds.

    An entry lives only while a retry is due: it is dropped when the failure is final (not
    retried, or the last attempt), so nothing accumulates across runs.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self._lost: dict[str, Usage] = {}

    def _will_retry(self, exc: BaseException, attempt: int) -> bool:
        retry_on = self.policy.retry_on
        if not isinstance(exc, Exception):
            return False
        # As LangGraph reads retry_on (pregel._retry._should_retry_on).
        if isinstance(retry_on, type):
            retried = isinstance(exc, retry_on)
        elif callable(retry_on):
            retried = retry_on(exc)
        else:
            retried = isinstance(exc, tuple(retry_on))
        return retried and attempt < self.policy.max_attempts

    def counted(self, node: Node[ContextT], on_failure: OnFailure | None = None) -> Node[ContextT]:
        """`node` with every attempt's requests counted in the usage it returns; with
        `on_failure`, a failure it turns into an outcome ends the node with that outcome."""

        async def attempt(state: Any, runtime: Runtime[ContextT]) -> Outcome:
            info = runtime.execution_info
            if info is None:  # LangGraph sets it on every node it runs
                raise RuntimeError("a model-calling node ran outside a LangGraph task")
            key, number = info.task_id, info.node_attempt
            with metered() as meter:
                try:
                    outcome = await node(state, runtime)
                except BaseException as exc:
                    lost = self._lost.pop(key, Usage()) + meter.total()
                    handled = (
                        on_failure(state, exc)
                        if on_failure is not None and isinstance(exc, Exception)
                        else None
                    )
                    if handled is not None:
                        return with_usage(handled, lost)
                    if self._will_retry(exc, number):
                        self._lost[key] = lost
                    raise
            extra = self._lost.pop(key, Usage()) + Usage(failed_calls=meter.failed_calls)
            return with_usage(outcome, extra)

        attempt.__name__ = getattr(node, "__name__", "attempt")
        attempt.__doc__ = node.__doc__
        return attempt


def with_usage(outcome: Outcome, extra: Usage) -> Outcome:
    """`outcome` with `extra` added to the usage it writes (a Command's update too)."""
    if extra == Usage():
        return outcome
    if isinstance(outcome, Command):
        update = dict(outcome.update or {})
        update["usage"] = add_usage(update.get("usage"), extra.as_dict())
        return replace(outcome, update=update)
    return {**outcome, "usage": add_usage(outcome.get("usage"), extra.as_dict())}
