"""Benchmark questions that resume mid-way: every node of every question is checkpointed.

On a slow server one question can outlast a session, and without checkpoints a question
stopped part-way starts again from its first step, so it might never finish. Here each
question is a LangGraph thread (its id the record key) in the run folder's
`checkpoints.sqlite`: a stopped question resumes after its last finished node, with the usage
of the steps it kept. Work inside the node that was running when it stopped is done again (its
lost tokens are in the server's counter, not the record), and its latency is the time it ran:
first to last checkpoint before the stop, plus the run that finished it. A recorded question's
thread is deleted, so the file only ever holds the questions in flight.

The saver writes on the event loop itself (persistence.checkpointers.InlineSqliteSaver): a
local write is far cheaper than handing it to a thread. With `--workers N` every process opens
this one file (evals.harness.pool): WAL mode lets readers never wait for the writer, and each
connection waits up to BUSY_TIMEOUT_S for another process's write (SQLite's 5 s default can
pass on a loaded machine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from mur.graphs.solve import thread_status
from mur.graphs.state import Context, output_of
from mur.persistence.checkpointers import InlineSqliteSaver

CHECKPOINTS = "checkpoints.sqlite"
BUSY_TIMEOUT_S = 120.0  # seconds a write waits for another process's to end


@asynccontextmanager
async def open_checkpoints(folder: Path) -> AsyncIterator[BaseCheckpointSaver]:
    """The folder's checkpoint saver, open for the run: its tables made and WAL mode set now
    (`setup`), before any question writes, so processes opening it together wait their turn
    once, here."""
    with InlineSqliteSaver.open(folder / CHECKPOINTS, BUSY_TIMEOUT_S) as saver:
        yield saver


@dataclass(frozen=True)
class Solved:
    output: dict[str, Any]
    earlier_s: float  # seconds the question ran before this run (0 unless resumed)
    resumed: bool


async def solve_resumable(
    graph: Any, graph_input: dict[str, Any], context: Context, thread_id: str
) -> Solved:
    """Run the question on `graph` (compiled with a checkpointer) as thread `thread_id`, or go
    on where that thread stopped; a thread that had finished gives its output again."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    status, values = await thread_status(graph, config)
    if status == "stale":
        await forget(graph, thread_id)
    if status in ("new", "stale"):
        return Solved(await graph.ainvoke(graph_input, config=config, context=context), 0.0, False)
    # How long it ran before it stopped: from the thread's first checkpoint to its last.
    saved = graph.checkpointer.alist(config)
    stamps = [datetime.fromisoformat(t.checkpoint["ts"]) async for t in saved]
    earlier = (max(stamps) - min(stamps)).total_seconds() if stamps else 0.0
    if status == "finished":  # finished, but stopped before it was recorded
        return Solved(output_of(values), earlier, True)
    return Solved(await graph.ainvoke(None, config=config, context=context), earlier, True)


async def forget(graph: Any, thread_id: str) -> None:
    """Delete a question's checkpoints (once it is recorded, or when they cannot resume)."""
    await graph.checkpointer.adelete_thread(thread_id)
