"""Every attempt of a model-calling node counts: what the server answered and what failed.

The graph's RetryPolicy (graphs.mur.MODEL_RETRY) is the one retry loop: a node whose request
fails runs again from the start. Without help, the tokens of requests the server had already
answered in the failed attempt (a refine node's earlier inner calls, the sibling candidates of
a gather) would vanish from the usage although the server spent them. So each attempt runs
under a `CallMeter` (nodes.llm); a failed attempt's count is kept under the node's task id and
added to the usage of the attempt that succeeds, with every request that got no usable answer
counted as `failed_calls`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import RetryPolicy

from nodes.llm import Usage, add_usage, metered

Update = dict[str, Any]
Node = Callable[[Any, Runtime[Any]], Awaitable[Update]]


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
        retried = retry_on(exc) if callable(retry_on) else isinstance(exc, retry_on)
        return isinstance(exc, Exception) and retried and attempt < self.policy.max_attempts

    def counted(self, node: Node) -> Node:
        """`node` with every attempt's requests counted in the usage it returns."""

        async def attempt(state: Any, runtime: Runtime[Any]) -> Update:
            info = runtime.execution_info
            key, number = info.task_id, info.node_attempt
            with metered() as meter:
                try:
                    update = await node(state, runtime)
                except BaseException as exc:
                    lost = self._lost.pop(key, Usage()) + meter.total()
                    if self._will_retry(exc, number):
                        self._lost[key] = lost
                    raise
            extra = self._lost.pop(key, Usage()) + Usage(failed_calls=meter.failed_calls)
            if extra == Usage():
                return update
            return {**update, "usage": add_usage(update.get("usage"), extra.as_dict())}

        attempt.__name__ = getattr(node, "__name__", "attempt")
        attempt.__doc__ = node.__doc__
        return attempt
