"""The MUR endpoint over a scripted backbone (testing/scripted_chat.py), for load tests:
every reply is known in advance, so a load test can check each one exactly.

    python -m mur.cli.fakes endpoint [--port 8051] [--max-runs 64] [--checkpointer TARGET]
        [--call-delay 0] [--lease-seconds 30] [--calls-log PATH]

A question `Load request N: ...` gets the steps `draft step 1 of request N`, then step 2
(scaled by the gamma-gate: the critic says No and the revision `revised step 2 of request N`
is kept; with gate never the draft is kept), then `So the answer is 2N.`. A question holding
`[fault at step K]` makes the backbone fail at step K with an error that is not retried: an
injected fault (502 before the first step, an error in the stream after it).

For the chaos benchmark (benchmarks/chaos.py) a replica of it checkpoints in PostgreSQL
(`--checkpointer`, or MUR_CHECKPOINTER, which keeps the password out of the process list),
each model call takes `--call-delay` seconds (an asyncio sleep: the event loop goes on), and
`--calls-log` appends one line per call, `<request number> <step>`, to a file every replica
shares, so what a killed replica computed is still counted after it died.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult

from mur.endpoint import create_app
from mur.endpoint.runs import DEFAULT_LEASE_SECONDS
from mur.persistence.checkpointers import MEMORY
from mur.testing.scripted_chat import FakeLogprobChat, Scripted

DRAFT_UNCERTAINTY = {1: 1.0, 2: 1.3, 3: 0.15}  # the gamma-gate scales step 2 only


class InjectedFault(RuntimeError):
    """A backbone failure the load test asked for."""


def question_number(question: str) -> int:
    found = re.search(r"Load request (\d+)", question)
    if found is None:
        raise ValueError(f"not a load-test question: {question[:80]!r}")
    return int(found.group(1))


def expected_content(number: int, scaled: bool) -> str:
    """The content of the reply to request `number` (step 2 revised when the gate scales)."""
    second = "revised" if scaled else "draft"
    return (
        f"Step1: draft step 1 of request {number}\n"
        f"Step2: {second} step 2 of request {number}\n"
        f"Step3: So the answer is {2 * number}.\n"
    )


def step_index(messages: list[BaseMessage]) -> int:
    found = re.findall(r"Step(\d+):$", str(messages[-1].content))
    return int(found[-1]) if found else 0


def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
    """The scripted backbone (and critic): replies from the question and the step index."""
    first = str(messages[0].content)
    if isinstance(messages[0], HumanMessage) and "You are a teacher" in first:
        return Scripted("Wrong. \\boxed{No}", [-0.1] * 5, stop_reason=None)
    question = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
    number = question_number(question)
    index = step_index(messages)
    fault = re.search(r"\[fault at step (\d+)\]", question)
    if fault and int(fault.group(1)) == index:
        raise InjectedFault(f"injected fault at step {index} of request {number}")
    if "incorrect" in str(messages[-2].content):
        return Scripted(f" revised step {index} of request {number}", [-0.1] * 3)
    if index == 3:
        return Scripted(
            f" So the answer is {2 * number}.", [-DRAFT_UNCERTAINTY[3]] * 6, stop_reason=None
        )
    return Scripted(f" draft step {index} of request {number}", [-DRAFT_UNCERTAINTY[index]] * 4)


class SlowScriptedChat(FakeLogprobChat):
    """The scripted backbone with a per-call delay, each call logged to a shared file."""

    delay: float = 0.0
    calls_log: str | None = None

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.calls_log:
            asked = re.search(r"Load request (\d+)", " ".join(str(m.content) for m in messages))
            line = f"{asked.group(1) if asked else -1} {step_index(messages)}\n".encode()
            descriptor = os.open(self.calls_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(descriptor, line)  # one write to an O_APPEND file: lines never mix
            finally:
                os.close(descriptor)
        await asyncio.sleep(self.delay)
        result = self._generate(messages, stop, run_manager, **kwargs)
        self.calls.clear()  # a long benchmark keeps no history of its calls
        return result


def make_app(
    max_runs: int = 64,
    *,
    checkpointer: str = MEMORY,
    call_delay: float = 0.0,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    calls_log: str | None = None,
) -> Any:
    backbone = (
        SlowScriptedChat(responder=respond, delay=call_delay, calls_log=calls_log)
        if call_delay or calls_log
        else FakeLogprobChat(responder=respond)  # as `mur bench endpoint_load` measured it
    )
    return create_app(
        backbone, max_runs=max_runs, checkpointer=checkpointer, lease_seconds=lease_seconds
    )
