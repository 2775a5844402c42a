"""The benchmark runner and reports: resume without loss or duplicates, numbers from records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.datasets import load_dataset
from evals.records import RecordStore, load_records
from evals.report import summarize, to_markdown, write_report
from evals.runner import plan_jobs, run_jobs
from fakes import FakeLogprobChat, Scripted
from graphs import Context, build_graph


def respond(messages, kwargs):
    if "You are a teacher" in str(messages[0].content):
        return Scripted("\\boxed{No}", [-0.1] * 3, stop_reason=None)
    if "Step2:" in str(messages[-1].content):
        return Scripted(" So the answer is 5.", [-0.9] * 5, stop_reason=None)
    return Scripted(" think about it", [-0.2] * 4)


class Crash(BaseException):
    """Like Ctrl-C or a killed process: not an error the runner records and rides over."""


class Interrupting:
    """A graph that stops the whole run after `after` questions."""

    def __init__(self, graph, after: int) -> None:
        self.graph, self.after, self.calls = graph, after, 0

    async def ainvoke(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.after:
            raise Crash
        return await self.graph.ainvoke(*args, **kwargs)


def jobs_for(problems):
    return plan_jobs(
        problems,
        "critic",
        ["mur", "always", "never"],
        [0.8, 0.9],
        1,
        lambda gate, gamma, sample, budget: Context(
            gate=gate, gamma=gamma, seed=sample, max_steps=3
        ),
    )


def test_plan_runs_gamma_blind_gates_once() -> None:
    problems = load_dataset("math500", limit=2)
    jobs = jobs_for(problems)
    assert len(jobs) == 2 * (2 + 1 + 1)
    assert {j.key.gamma for j in jobs if j.key.gate == "always"} == {None}
    assert len({j.key.text for j in jobs}) == len(jobs)


async def test_interrupted_run_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    problems = load_dataset("math500", limit=3)
    jobs = jobs_for(problems)
    graph = build_graph("critic", backbone=FakeLogprobChat(responder=respond))
    store = RecordStore(tmp_path)
    with pytest.raises(Crash):
        await run_jobs(Interrupting(graph, 5), jobs, store, concurrency=1, show_progress=False)
    assert len(store.load()) == 5
    # A crash in the middle of a write leaves half a line behind.
    with store.path.open("ab") as handle:
        handle.write(b'{"key": "math500/half')
    store = RecordStore(tmp_path)
    assert store.dropped_bytes > 0
    done = store.done_keys()
    todo = [job for job in jobs if job.key.text not in done]
    outcome = await run_jobs(graph, todo, store, concurrency=4, show_progress=False)
    assert (outcome.finished, outcome.failed) == (len(jobs) - 5, 0)
    keys = [record["key"] for record in load_records(tmp_path)]
    assert sorted(keys) == sorted(job.key.text for job in jobs)
    assert all(line.endswith("}") for line in store.path.read_text().splitlines())


async def test_failures_are_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    calls = {"n": 0}

    def flaky(messages, kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("the server said no")
        return respond(messages, kwargs)

    problems = load_dataset("math500", limit=2)
    jobs = plan_jobs(
        problems,
        "critic",
        ["never"],
        [0.9],
        1,
        lambda gate, gamma, sample, budget: Context(gate=gate, max_steps=3),
    )
    graph = build_graph("critic", backbone=FakeLogprobChat(responder=flaky))
    store = RecordStore(tmp_path)
    outcome = await run_jobs(graph, jobs, store, concurrency=1, show_progress=False)
    assert (outcome.finished, outcome.failed, outcome.server_gone) == (1, 1, None)
    error = json.loads(store.errors_path.read_text())
    assert error["error"] == "ValueError" and "server said no" in error["message"]


def record(dataset, gate, gamma, correct, backbone, external, steps, scaled, latency):
    return {
        "key": f"{dataset}/{gate}/{gamma}/{backbone}",
        "dataset": dataset,
        "strategy": "critic",
        "gate": gate,
        "gamma": gamma,
        "correct": correct,
        "usage": {"backbone_tokens": backbone, "external_tokens": external},
        "steps_total": steps,
        "steps_scaled": scaled,
        "latency_s": latency,
    }


def test_report_numbers_recompute_from_records(tmp_path: Path) -> None:
    records = [
        record("math500", "always", None, True, 100, 50, 4, 4, 1.0),
        record("math500", "always", None, False, 300, 150, 6, 6, 3.0),
        record("math500", "mur", 0.9, True, 120, 10, 4, 1, 0.5),
        record("math500", "mur", 0.9, True, 80, 0, 2, 0, 1.5),
        record("aime24", "always", None, False, 1000, 0, 8, 8, 2.0),
        record("aime24", "mur", 0.9, False, 500, 0, 8, 2, 2.0),
    ]
    rows = {(r.dataset, r.gate): r for r in summarize(records)}
    always, mur = rows[("math500", "always")], rows[("math500", "mur")]
    assert always.accuracy == 50.0 and mur.accuracy == 100.0
    assert always.total_tokens == 300.0 and mur.total_tokens == 105.0
    assert mur.tokens_vs_always == pytest.approx(105 / 300)
    assert mur.steps_scaled == 0.5 and mur.latency_p50 == 1.0
    average = rows[("average", "mur")]
    assert average.accuracy == pytest.approx(50.0)
    assert average.total_tokens == pytest.approx((105 + 500) / 2)
    assert average.tokens_vs_always == pytest.approx(((105 + 500) / 2) / ((300 + 1000) / 2))
    assert "| math500 | critic | mur | 0.9 | 2 | 100.0 |" in to_markdown(list(rows.values()))


def test_report_writes_tables_and_a_gamma_plot(tmp_path: Path) -> None:
    lines = [
        record("math500", "mur", gamma, gamma > 0.8, int(100 * gamma), 0, 3, 1, 1.0)
        for gamma in (0.7, 0.8, 0.9)
    ]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    report = write_report(tmp_path)
    assert report.markdown_path.exists() and report.json_path.exists()
    assert report.plot_path is not None and report.plot_path.stat().st_size > 1000
    assert len(json.loads(report.json_path.read_text())) == 3


async def test_a_dead_server_stops_the_run_early(tmp_path: Path) -> None:
    from faulty_server import MODEL, faulty_server
    from servers import make_chat_model

    problems = load_dataset("math500", limit=6)
    jobs = plan_jobs(
        problems,
        "critic",
        ["never"],
        [0.9],
        1,
        lambda gate, gamma, sample, budget: Context(gate=gate, max_steps=2),
    )
    with faulty_server(["ok", "ok", "500"]) as server:
        model = make_chat_model(server.base_url, MODEL, max_retries=0)
        graph = build_graph("critic", backbone=model)
        store = RecordStore(tmp_path)
        outcome = await run_jobs(
            graph, jobs, store, concurrency=1, show_progress=False, give_up_after=2
        )
    assert outcome.finished == 2 and outcome.failed == 2 and outcome.skipped == 2
    assert "500" in outcome.server_gone
    assert len(store.load()) == 2


async def test_every_request_of_a_job_carries_that_jobs_session(tmp_path: Path) -> None:
    """One session id per job (run id + job key) on every backbone and verifier request."""
    from servers.sessions import current_session_id

    seen: list[tuple[str | None, str]] = []

    def recording(messages, kwargs):
        seen.append((current_session_id(), str(messages[-1].content)))
        return respond(messages, kwargs)

    problems = load_dataset("math500", limit=3)
    jobs = plan_jobs(
        problems,
        "critic",
        ["always", "never"],
        [0.9],
        1,
        lambda gate, gamma, sample, budget: Context(gate=gate, max_steps=3),
    )
    model = FakeLogprobChat(responder=recording)
    graph = build_graph("critic", backbone=model, verifier=model)
    store = RecordStore(tmp_path)
    await run_jobs(graph, jobs, store, concurrency=4, show_progress=False, run_id="run-7")
    sessions = {sid for sid, _ in seen}
    assert sessions == {f"run-7/{job.key.text}" for job in jobs}
    for record in load_records(tmp_path):
        calls = [sid for sid, _ in seen if sid == f"run-7/{record['key']}"]
        assert len(calls) == record["usage"]["llm_calls"]  # judge calls included
