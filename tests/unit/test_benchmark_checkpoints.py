"""A benchmark question stopped part-way resumes after its last finished node
(evals.harness.checkpoints), with the usage and steps a run without a stop would have recorded."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from fakes import FakeLogprobChat, Scripted
from mur.evals.harness.checkpoints import CHECKPOINTS, open_checkpoints
from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.progress import RunProgress
from mur.evals.harness.records import RecordStore, load_records, records_so_far
from mur.evals.harness.runner import run_jobs
from mur.evals.questions import load_dataset
from mur.graphs import build_graph
from mur.servers import ServerStopped

TEST_DATA = Path(__file__).resolve().parents[1] / "data"


class OldState(TypedDict):
    question: str


def respond(messages, kwargs):
    """Three drafted steps, each judged wrong by the critic and revised: many calls."""
    if "You are a teacher" in str(messages[0].content):
        return Scripted("\\boxed{No}", [-0.1] * 3, stop_reason=None)
    if str(messages[-1].content).count("Step") >= 3:
        return Scripted(" So the answer is 5.", [-0.9] * 5, stop_reason=None)
    return Scripted(" think about it", [-0.2] * 4)


def failing_after(calls: int, error: Exception):
    """Answers `calls` requests, then fails every one (a server that went away)."""

    def responder(messages, kwargs):
        responder.calls += 1
        if responder.calls > calls:
            raise error
        return respond(messages, kwargs)

    responder.calls = 0
    return responder


def always_job():
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", TEST_DATA, limit=1)),
        gates=("always",),
        settings={"max_steps": 6},
    )
    return plan.jobs()


async def run(folder: Path, responder, checkpoints: Path | None) -> FakeLogprobChat:
    chat = FakeLogprobChat(responder=responder)
    store = RecordStore(folder)
    if checkpoints is None:
        graph = build_graph(backbone=chat)
        await run_jobs(graph, always_job(), store, concurrency=1, show_progress=False)
        return chat
    async with open_checkpoints(checkpoints) as saver:
        graph = build_graph(backbone=chat, checkpointer=saver)
        await run_jobs(graph, always_job(), store, concurrency=1, show_progress=False)
    return chat


async def test_a_stopped_question_resumes_where_it_stopped(
    tmp_path: Path, runner_progress: list[RunProgress]
) -> None:
    whole = await run(tmp_path / "whole", respond, None)
    [expected] = load_records(tmp_path / "whole")
    assert len(whole.calls) >= 8

    folder = tmp_path / "resumed"
    folder.mkdir()
    # The server goes away inside the question, after a few finished nodes (and the graph's
    # retries): the question fails, and its checkpoints stay for the next run.
    await run(folder, failing_after(5, ConnectionError("server gone")), folder)
    assert (folder / CHECKPOINTS).exists() and not records_so_far(folder)

    rest = await run(folder, respond, folder)
    [record] = load_records(folder)
    # The progress counts as made in this run only what the resumed run made (its ETA's
    # "spent on questions in flight" would otherwise go negative).
    assert 0 < runner_progress[-1].tokens < record["usage"]["backbone_tokens"]
    # Only the nodes not finished before the stop ran again (the first draft did not).
    assert 0 < len(rest.calls) < len(whole.calls)
    assert record["resumed"] is True
    assert [s["text"] for s in record["trace"]["steps"]] == [
        s["text"] for s in expected["trace"]["steps"]
    ]
    assert record["usage"] == expected["usage"]  # the kept steps' tokens, counted once
    assert record["answer"] == expected["answer"] and "resumed" not in expected

    # Recorded: its thread is gone, so the file holds only questions in flight.
    async with open_checkpoints(folder) as saver:
        assert [t async for t in saver.alist(None)] == []


async def test_a_question_that_fails_on_its_own_starts_afresh(tmp_path: Path) -> None:
    """Not the server's fault (e.g. a 4xx): resuming would fail the same way, so its
    checkpoints go."""
    await run(tmp_path, failing_after(5, ValueError("bad request")), tmp_path)
    async with open_checkpoints(tmp_path) as saver:
        assert [t async for t in saver.alist(None)] == []
    assert not records_so_far(tmp_path)


async def test_a_question_stopped_by_servers_down_resumes_later(tmp_path: Path) -> None:
    """`mur servers down` during the question (ServerStopped): not the question's fault, so
    its checkpoints stay for the run that follows the next `mur servers up`."""
    stopped = ServerStopped("the cpu-tiny server was stopped with `mur servers down`")
    await run(tmp_path, failing_after(5, stopped), tmp_path)
    async with open_checkpoints(tmp_path) as saver:
        assert [t async for t in saver.alist(None)] != []
    assert not records_so_far(tmp_path)


async def test_a_checkpoint_of_an_older_graph_starts_afresh(tmp_path: Path) -> None:
    """A thread stopped before a node the graph no longer has (the old single `refine` node,
    say) has nothing to go on from: the question runs again instead of being recorded as
    finished with no answer."""
    old = StateGraph(OldState)
    old.add_node("draft_step", lambda state: {"question": state["question"]})
    old.add_node("refine", lambda state: {})
    old.add_edge(START, "draft_step")
    old.add_edge("draft_step", "refine")
    old.add_edge("refine", END)
    [job] = always_job()
    thread = job.key.text
    async with open_checkpoints(tmp_path) as saver:
        stopped = old.compile(checkpointer=saver, interrupt_before=["refine"])
        config = {"configurable": {"thread_id": thread}}
        await stopped.ainvoke({"question": job.problem.question}, config=config)
        assert (await stopped.aget_state(config)).next == ("refine",)
    chat = await run(tmp_path, respond, tmp_path)
    [record] = load_records(tmp_path)
    assert record["answer"] == "5" and "resumed" not in record
    assert len(chat.calls) >= 8  # the whole question ran
