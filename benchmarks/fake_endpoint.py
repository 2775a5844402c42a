"""The MUR endpoint over a scripted backbone (tests/fakes.py), for load tests: every reply is
known in advance, so a load test can check each one exactly.

    python -m mur.benchmarks.fake_endpoint [--port 8051] [--max-runs 64]

A question `Load request N: ...` gets the steps `draft step 1 of request N`, then step 2
(scaled by the gamma-gate: the critic says No and the revision `revised step 2 of request N`
is kept; with gate never the draft is kept), then `So the answer is 2N.`. A question holding
`[fault at step K]` makes the backbone fail at step K with an error that is not retried: an
injected fault (502 before the first step, an error in the stream after it).
"""

from __future__ import annotations

import re
from typing import Any

import uvicorn
from langchain_core.messages import BaseMessage, HumanMessage

from mur.endpoint import create_app
from mur.endpoint.cli import KEEP_ALIVE_SECONDS
from mur.servers.cli import OneLineParser
from tests.fakes import FakeLogprobChat, Scripted

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


def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
    """The scripted backbone (and critic): replies from the question and the step index."""
    first = str(messages[0].content)
    if isinstance(messages[0], HumanMessage) and "You are a teacher" in first:
        return Scripted("Wrong. \\boxed{No}", [-0.1] * 5, stop_reason=None)
    question = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
    number = question_number(question)
    found = re.findall(r"Step(\d+):$", str(messages[-1].content))
    index = int(found[-1]) if found else 0
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


def make_app(max_runs: int = 64) -> Any:
    return create_app(FakeLogprobChat(responder=respond), max_runs=max_runs)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="python -m mur.benchmarks.fake_endpoint",
        description="Serve the MUR endpoint over the scripted load-test backbone.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8051)
    parser.add_argument("--max-runs", type=int, default=64)
    args = parser.parse_args(argv)
    uvicorn.run(
        make_app(args.max_runs),
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,  # as `mur endpoint` serves
    )


if __name__ == "__main__":
    main()
