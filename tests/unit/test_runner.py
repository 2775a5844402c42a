"""The benchmark runner: resume without loss or duplicates, failures recorded, progress shown
(report numbers: test_report.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fakes import FakeLogprobChat, Scripted
from faulty_server import faulty_server
from mur.evals.evaluation import record_command, run_evaluation
from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.records import RecordStore, load_records
from mur.evals.harness.runner import GiveUpRule, run_jobs
from mur.evals.questions import load_dataset
from mur.graphs import Context, build_graph
from mur.servers import ServerStopped, make_chat_model

TEST_DATA = Path(__file__).resolve().parents[1] / "data"  # a math500.jsonl of the tests' own


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
    return EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(problems),
        gates=("mur", "always", "never"),
        gammas=(0.8, 0.9),
        settings={"max_steps": 3},
    ).jobs()


def never_jobs(problems, max_steps: int):
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(problems),
        gates=("never",),
        settings={"max_steps": max_steps},
    )
    return plan.jobs()


def test_plan_runs_gamma_blind_gates_once() -> None:
    problems = load_dataset("math500", TEST_DATA, limit=2)
    jobs = jobs_for(problems)
    assert len(jobs) == 2 * (2 + 1 + 1)
    assert {j.key.gamma for j in jobs if j.key.gate == "always"} == {None}
    assert len({j.key.text for j in jobs}) == len(jobs)


def test_plan_contexts_carry_settings_seed_per_sample_and_budgets() -> None:
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", limit=1)),
        gates=("mur",),
        gammas=(0.7,),
        budgets=(("budget_tokens", 300), ("target_scale_rate", 0.25)),
        samples=2,
        settings={"seed": 5, "max_steps": 3},
    )
    jobs = {(j.key.gate, j.key.sample): j for j in plan.jobs()}
    assert sorted({gate for gate, _ in jobs}) == ["mur", "mur[budget=300]", "mur[rate=0.25]"]
    assert [jobs["mur", s].context.seed for s in (0, 1)] == [5, 6]
    assert jobs["mur", 1].context == Context(gate="mur", gamma=0.7, seed=6, max_steps=3)
    budget = jobs["mur[budget=300]", 0]
    assert budget.key.gamma is None and budget.context.gate == "mur"
    assert budget.context.budget_tokens == 300 and budget.context.max_steps == 3
    assert jobs["mur[rate=0.25]", 0].context.target_scale_rate == 0.25


def test_run_evaluation_writes_records_report_and_the_command(tmp_path: Path, capsys) -> None:
    model = FakeLogprobChat(responder=respond)
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", limit=2)),
        gates=("mur", "never"),
        settings={"max_steps": 3},
        out=tmp_path,
        command="python run.py --strategy critic --dataset math500 --limit 2",
    )
    assert run_evaluation(plan, model, model) == 0
    assert (tmp_path / "command.txt").read_text() == plan.command + "\n"
    records = load_records(tmp_path)
    assert sorted(r["gate"] for r in records) == ["mur", "mur", "never", "never"]
    assert records[0]["trace"]["config"]["max_steps"] == 3
    # Each record is dated, so a report can say how long a table resumed across sessions took.
    finished = [datetime.fromisoformat(r["finished_at"]) for r in records]
    assert all(abs(datetime.now(UTC) - f) < timedelta(minutes=5) for f in finished)
    assert (tmp_path / "report.md").exists()
    assert run_evaluation(plan, model, model) == 0  # everything done: nothing runs again
    assert len(load_records(tmp_path)) == 4
    assert "0 to go" in capsys.readouterr().err


def test_a_folder_refuses_runs_with_other_settings(tmp_path: Path, capsys) -> None:
    model = FakeLogprobChat(responder=respond)

    def plan(**settings) -> EvaluationPlan:
        return EvaluationPlan(
            dataset="math500",
            strategy="critic",
            problems=tuple(load_dataset("math500", limit=1)),
            gates=("never",),
            settings={"max_steps": 3, **settings},
            out=tmp_path,
        )

    assert run_evaluation(plan(), model, model) == 0
    recorded = json.loads((tmp_path / "settings.json").read_text())
    assert recorded["max_steps"] == 3 and recorded["judge_force_verdict"] is False
    assert recorded["backbone_model"] == "FakeLogprobChat"
    assert "gate" not in recorded and "gamma" not in recorded
    capsys.readouterr()

    assert run_evaluation(plan(judge_force_verdict=True), model, model) == 2
    error = capsys.readouterr().err
    assert "judge_force_verdict=False" in error and "judge_force_verdict=True" in error
    assert "--out a new folder" in error
    assert len(load_records(tmp_path)) == 1  # nothing ran

    # A setting the file does not name yet (added since its runs) is taken as it comes.
    del recorded["critic_rounds"]
    (tmp_path / "settings.json").write_text(json.dumps(recorded))
    assert run_evaluation(plan(), model, model) == 0
    assert json.loads((tmp_path / "settings.json").read_text())["critic_rounds"] == 1


async def test_interrupted_run_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    problems = load_dataset("math500", TEST_DATA, limit=3)
    jobs = jobs_for(problems)
    graph = build_graph(backbone=FakeLogprobChat(responder=respond))
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

    problems = load_dataset("math500", TEST_DATA, limit=2)
    jobs = never_jobs(problems, max_steps=3)
    graph = build_graph(backbone=FakeLogprobChat(responder=flaky))
    store = RecordStore(tmp_path)
    outcome = await run_jobs(graph, jobs, store, concurrency=1, show_progress=False)
    assert (outcome.finished, outcome.failed, outcome.server_gone) == (1, 1, None)
    error = json.loads(store.errors_path.read_text())
    assert error["error"] == "ValueError" and "server said no" in error["message"]


async def test_a_dead_server_stops_the_run_early(tmp_path: Path) -> None:
    problems = load_dataset("math500", TEST_DATA, limit=6)
    jobs = never_jobs(problems, max_steps=2)
    with faulty_server(["ok", "ok", "500"]) as server:
        graph = build_graph(backbone=make_chat_model(server.base_url))
        store = RecordStore(tmp_path)
        outcome = await run_jobs(
            graph, jobs, store, concurrency=1, show_progress=False, give_up_after=2
        )
    assert outcome.finished == 2 and outcome.failed == 2 and outcome.skipped == 2
    assert "500" in outcome.server_gone
    assert len(store.load()) == 2


async def test_a_server_stopped_on_purpose_stops_the_run_at_once(tmp_path: Path) -> None:
    """ServerStopped (`mur servers down` during the run, servers.connect.Healer): no question
    starts after it, without waiting for `give_up_after` failures, and the run says why."""
    said = "the cpu-tiny server was stopped with `mur servers down`: start it and run again"

    def stopped(messages, kwargs):
        raise ServerStopped(said)

    jobs = never_jobs(load_dataset("math500", TEST_DATA, limit=4), max_steps=2)
    graph = build_graph(backbone=FakeLogprobChat(responder=stopped))
    store = RecordStore(tmp_path)
    outcome = await run_jobs(graph, jobs, store, concurrency=1, show_progress=False)
    assert (outcome.finished, outcome.failed, outcome.skipped) == (0, 1, 3)
    assert outcome.server_gone == said


def test_the_give_up_rule_counts_server_failures_in_a_row_and_keeps_the_first_reason() -> None:
    """One rule for a run in one process and for the parent of workers (harness/pool.py)."""
    assert GiveUpRule.for_concurrency(4, after=2).after == 2
    rule = GiveUpRule.for_concurrency(1)  # more than the questions in flight: 3 in a row
    for why, server in [("500", True), ("its own", False), ("a", True), ("b", True)]:
        rule.failed(why, server)  # a question's own failure starts the count again
    rule.succeeded()
    rule.failed("c", server=True)
    rule.failed("d", server=True)
    assert rule.gone is None
    rule.failed("e", server=True)
    rule.give_up("stopped on purpose")
    rule.failed("f", server=True)
    assert rule.gone == "e"


def test_command_txt_keeps_every_command_that_filled_the_folder(tmp_path: Path) -> None:
    path = tmp_path / "command.txt"
    record_command(path, "python run.py --gate mur,always")
    record_command(path, "python run.py --gate mur,always")  # a resumed run
    record_command(path, "python run.py --gate mur --gamma 0.5,1.2")  # a sweep added later
    assert path.read_text().splitlines() == [
        "python run.py --gate mur,always",
        "python run.py --gate mur --gamma 0.5,1.2",
    ]


async def test_a_context_overflow_is_a_record_not_an_error(tmp_path: Path) -> None:
    problems = load_dataset("math500", TEST_DATA, limit=2)
    jobs = never_jobs(problems, max_steps=3)
    # Each question: one step, then a draft the server refuses as too long for its context.
    with faulty_server(["step", "overflow:5000", "step", "overflow:5000"]) as server:
        graph = build_graph(backbone=make_chat_model(server.base_url))
        store = RecordStore(tmp_path)
        outcome = await run_jobs(graph, jobs, store, concurrency=1, show_progress=False)
    assert (outcome.finished, outcome.failed) == (2, 0)
    assert not store.errors_path.exists()
    records = load_records(tmp_path)
    assert [r["finish_reason"] for r in records] == ["context_length"] * 2
    assert all(r["steps_total"] == 1 and r["usage"]["failed_calls"] == 1 for r in records)


async def test_every_request_of_a_job_carries_that_jobs_session(tmp_path: Path) -> None:
    """One session id per job (run id + job key) on every backbone and verifier request."""
    from mur.servers.clients.sessions import current_session_id

    seen: list[tuple[str | None, str]] = []

    def recording(messages, kwargs):
        seen.append((current_session_id(), str(messages[-1].content)))
        return respond(messages, kwargs)

    problems = load_dataset("math500", TEST_DATA, limit=3)
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(problems),
        gates=("always", "never"),
        settings={"max_steps": 3},
    )
    jobs = plan.jobs()
    model = FakeLogprobChat(responder=recording)
    graph = build_graph(backbone=model, verifier=model)
    store = RecordStore(tmp_path)
    await run_jobs(graph, jobs, store, concurrency=4, show_progress=False, run_id="run-7")
    sessions = {sid for sid, _ in seen}
    assert sessions == {f"run-7/{job.key.text}" for job in jobs}
    for record in load_records(tmp_path):
        calls = [sid for sid, _ in seen if sid == f"run-7/{record['key']}"]
        assert len(calls) == record["usage"]["llm_calls"]  # judge calls included


class Signalling:
    """A graph that sends this process `sig` when its first question starts (`times` times,
    apart), then solves the question, or with `hang`, waits until it is cancelled."""

    def __init__(self, graph, sig: signal.Signals, *, times: int = 1, hang: bool = False) -> None:
        self.graph, self.sig, self.times, self.hang = graph, sig, times, hang
        self.started = 0

    async def ainvoke(self, *args, **kwargs):
        self.started += 1
        if self.started == 1:
            for _ in range(self.times):
                os.kill(os.getpid(), self.sig)
                await asyncio.sleep(0.05)  # the loop takes the signal in between
        if self.hang:
            await asyncio.Event().wait()
        return await self.graph.ainvoke(*args, **kwargs)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
async def test_a_first_stop_signal_finishes_the_questions_in_flight_and_starts_no_more(
    tmp_path: Path, sig: signal.Signals
) -> None:
    before = signal.getsignal(sig)
    jobs = never_jobs(load_dataset("math500", TEST_DATA, limit=6), max_steps=3)
    graph = Signalling(build_graph(backbone=FakeLogprobChat(responder=respond)), sig)
    store = RecordStore(tmp_path)
    outcome = await run_jobs(graph, jobs, store, concurrency=2, show_progress=False)
    # Those in flight when the signal came (1 or 2 of the 2 allowed) finished and are saved.
    assert outcome.stopped_by == sig.name
    assert 1 <= outcome.finished == graph.started <= 2
    assert len(store.load()) == outcome.finished
    assert (outcome.failed, outcome.skipped) == (0, len(jobs) - outcome.finished)
    assert signal.getsignal(sig) is before  # the process's own handler is back


async def test_a_second_stop_signal_cancels_the_questions_in_flight(tmp_path: Path) -> None:
    jobs = never_jobs(load_dataset("math500", TEST_DATA, limit=4), max_steps=3)
    graph = build_graph(backbone=FakeLogprobChat(responder=respond))
    hanging = Signalling(graph, signal.SIGTERM, times=2, hang=True)
    store = RecordStore(tmp_path)
    run = run_jobs(hanging, jobs, store, concurrency=2, show_progress=False)
    outcome = await asyncio.wait_for(run, timeout=30)
    assert (outcome.finished, outcome.failed, outcome.skipped) == (0, 0, len(jobs))
    assert outcome.stopped_by == "SIGTERM" and store.load() == []


def test_a_stopped_benchmark_says_what_is_saved_and_exits_130(tmp_path: Path, capsys) -> None:
    calls = {"n": 0}

    def stop_at_first_request(messages, kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return respond(messages, kwargs)

    model = FakeLogprobChat(responder=stop_at_first_request)
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", TEST_DATA, limit=3)),
        gates=("never",),
        settings={"max_steps": 3},
        out=tmp_path,
        concurrency=1,
    )
    assert run_evaluation(plan, model, model) == 130
    error = capsys.readouterr().err
    assert "SIGTERM: starting no new questions; the 1 in flight finish and are saved" in error
    assert f"stopped (SIGTERM): 1 runs finished this time and are saved in {tmp_path}" in error
    assert "2 left; rerun the same command" in error
    assert len(load_records(tmp_path)) == 1
    assert run_evaluation(plan, model, model) == 0  # the rerun finishes the other two
    assert len(load_records(tmp_path)) == 3
