"""One question solved from the command line, optionally checkpointed so it can resume.

With `--checkpoint TARGET` every node's state goes to an SQLite file (or PostgreSQL, a
`postgresql://` URL: persistence.checkpointers, the endpoint's factory) under a thread id; the same
`--checkpoint TARGET --thread-id ID` after a crash or Ctrl-C goes on after the last finished
node (graphs.solve resumes the thread). Every request of the question carries one session id, so a
vllm-router in front of replicas keeps the question on one of them.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from mur.cli.flags import single_context
from mur.cli.printer import Printer
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve
from mur.persistence.checkpointers import open_checkpointer
from mur.servers.clients.sessions import new_session_id, session
from mur.servers.connect import Connection

SAMPLE_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?"
)
# The session ids' first part: the servers' logs tell a command-line solve from the endpoint's.
SESSION_SOURCE = "run.py"


async def solve_question(
    args: argparse.Namespace, connection: Connection, printer: Printer
) -> dict[str, Any]:
    """Solve --question (or the sample), printing each step as it is kept; the output
    contract."""
    context = single_context(args, connection.recommended)
    question = args.question or SAMPLE_QUESTION
    printer.say(f"Question: {question}")
    printer.several = context.traces > 1

    def graph(checkpointer: Any = None) -> Any:
        return build_graph(
            backbone=connection.backbone, verifier=connection.verifier, checkpointer=checkpointer
        )

    if not args.checkpoint:
        with session(new_session_id(SESSION_SOURCE, uuid.uuid4().hex[:12])):
            solution = await solve(
                graph(),
                question,
                system_prompt=args.system_prompt,
                context=context,
                on_step=printer.step,
            )
        return solution.output
    thread_id = args.thread_id or uuid.uuid4().hex[:12]
    async with open_checkpointer(args.checkpoint) as store:
        printer.say(
            f"Checkpointing thread {thread_id} in {store.target}: resume with "
            f"--checkpoint {store.target} --thread-id {thread_id}"
        )
        with session(new_session_id(SESSION_SOURCE, thread_id)):
            solution = await solve(
                graph(store.saver),
                question,
                system_prompt=args.system_prompt,
                context=context,
                config={"configurable": {"thread_id": thread_id}},
                on_step=printer.step,
                on_resume=lambda: printer.say(f"Resuming thread {thread_id}"),
            )
        return solution.output
