"""Run progress: plain lines with rate and ETA when stderr is not a terminal, the bar when it is."""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from fakes import FakeLogprobChat, Scripted
from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.progress import RunProgress, duration
from mur.evals.harness.records import RecordStore
from mur.evals.harness.run_record import total_tokens
from mur.evals.harness.runner import run_jobs
from mur.evals.questions import load_dataset
from mur.graphs import build_graph


@pytest.fixture(autouse=True)
def _no_terminal_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich reads these before isatty(); a CI that sets them must not change what is tested.
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_TERMINAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_duration() -> None:
    assert [duration(s) for s in (0, 45.4, 60, 428, 3600, 11_000)] == [
        "0s",
        "45s",
        "1m00s",
        "7m08s",
        "1h00m",
        "3h03m",
    ]


async def test_plain_lines_every_few_questions_with_rate_and_eta() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = RunProgress(12, stream=stream, every=5, interval=600, clock=clock)
    assert progress.plain
    async with progress:
        for _ in range(12):
            clock.now += 30  # one question every 30 s: 2 q/min
            progress.finished_one(600)
    lines = stream.getvalue().splitlines()
    assert [re.match(r"progress: (\d+)/12", line).group(1) for line in lines] == [
        "0",
        "5",
        "10",
        "12",
    ]
    assert lines[0].endswith("ETA unknown")
    assert lines[1] == (
        "progress: 5/12 questions (41.7%), 0 failed, 2.0 q/min, 20 tok/s, elapsed 2m30s, ETA 3m30s"
    )
    assert lines[-1].endswith("elapsed 6m00s, done")


async def test_live_tokens_give_the_rate_and_eta_while_questions_are_in_flight() -> None:
    """24 questions start together and the server makes 60 tok/s; the first answer comes after
    10 min. Counting finished questions only would say 2 tok/s and ETA 3h50m for the rest."""
    stream, clock, live = io.StringIO(), Clock(), [0]
    progress = RunProgress(24, stream=stream, every=1, interval=600, clock=clock)
    progress.live_tokens = lambda: live[0]
    async with progress:
        clock.now += 600
        live[0] = 36_000  # 600 s at 60 tok/s, spread over the 24 in flight
        progress.finished_one(2_400)
    first = stream.getvalue().splitlines()[1]
    # 23 left at 2,400 tokens each, less the 33,600 already spent on them: 360 s at 60 tok/s.
    assert first == (
        "progress: 1/24 questions (4.2%), 0 failed, 0.1 q/min, 60 tok/s, elapsed 10m00s, ETA 6m00s"
    )


async def test_rate_and_eta_follow_the_last_window_not_the_whole_run() -> None:
    """20 min at 10 tok/s (the server was shared), then 10 min at 60 tok/s: the line says 60,
    as the server does now, not the 26.7 averaged since the start."""
    stream, clock, live = io.StringIO(), Clock(), [0]
    async with RunProgress(
        10, stream=stream, every=1, interval=6000, clock=clock, live_tokens=lambda: live[0]
    ) as progress:
        for minute in range(1, 31):
            clock.now += 60
            live[0] += 600 if minute <= 20 else 3_600
            if minute in (20, 30):
                progress.finished_one(10_000)
        progress.finished_one(10_000)
    lines = stream.getvalue().splitlines()
    assert ", 10 tok/s, elapsed 20m00s" in lines[1]
    # 7 left at 10,000 tokens each, less 18,000 spent on those in flight: 52,000 at 60 tok/s.
    assert lines[-1].endswith(", 60 tok/s, elapsed 30m00s, ETA 14m27s")


async def test_eta_falls_back_to_questions_when_tokens_say_nothing_is_left() -> None:
    stream, clock = io.StringIO(), Clock()
    async with RunProgress(
        4, stream=stream, every=1, interval=600, clock=clock, live_tokens=lambda: 10_000
    ) as progress:
        clock.now += 60
        progress.finished_one(100)
        progress.finished_one(100)  # those in flight spent more than expected
    assert stream.getvalue().splitlines()[-1].endswith("ETA 1m00s")


async def test_a_slow_question_still_prints_after_the_interval() -> None:
    stream, clock = io.StringIO(), Clock()
    async with RunProgress(100, stream=stream, every=5, interval=60, clock=clock) as progress:
        clock.now += 61
        progress.failed_one()  # not a multiple of 5, but a minute on
        clock.now += 10
        progress.finished_one(50)  # too soon for another
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # start, after the minute, the final count at the end
    assert "1/100 questions (1.0%), 1 failed" in lines[1]
    assert "2/100 questions" in lines[2]


async def test_heartbeat_when_nothing_finishes() -> None:
    stream = io.StringIO()
    async with RunProgress(3, stream=stream, every=5, interval=0.05):
        await asyncio.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("progress: 0/3 questions") for line in lines)


async def test_terminal_gets_the_bar_not_lines() -> None:
    stream = Terminal()
    progress = RunProgress(4, stream=stream, every=1)
    assert not progress.plain
    async with progress:
        for _ in range(4):
            progress.finished_one(10)
    assert "progress:" not in stream.getvalue()
    assert "4/4" in stream.getvalue()  # rich's bar, drawn on the terminal
    assert "tok/s  done" in stream.getvalue()  # with the lines' ETA, not rich's own


async def test_disabled_shows_nothing() -> None:
    stream = io.StringIO()
    async with RunProgress(2, enabled=False, stream=stream) as progress:
        progress.finished_one(2)
        progress.finished_one(3)
    assert stream.getvalue() == ""


def respond(messages, kwargs):
    if "You are a teacher" in str(messages[0].content):
        return Scripted("\\boxed{No}", [-0.1] * 3, stop_reason=None)
    return Scripted(" So the answer is 5.", [-0.9] * 5, stop_reason=None)


async def test_run_jobs_prints_progress_lines_to_a_non_terminal_stderr(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = load_dataset("math500", limit=6)
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(problems),
        gates=("never",),
        settings={"max_steps": 2},
    )
    jobs = plan.jobs()
    graph = build_graph(backbone=FakeLogprobChat(responder=respond))
    outcome = await run_jobs(graph, jobs, RecordStore(tmp_path), concurrency=2)
    assert outcome.finished == 6
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("progress: ")]
    assert [line.split()[1] for line in lines] == ["0/6", "5/6", "6/6"]
    assert "q/min" in lines[-1] and "tok/s" in lines[-1] and lines[-1].endswith("done")


async def test_run_jobs_counts_the_tokens_of_every_request_live(
    tmp_path, runner_progress: list[RunProgress]
) -> None:
    """The run-wide meter reaches the graph's requests: at the end it holds what the records
    hold (no request failed), so mid-run it counts the questions in flight as well."""
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", limit=3)),
        gates=("always",),
        settings={"max_steps": 2},
    )
    store = RecordStore(tmp_path)
    graph = build_graph(backbone=FakeLogprobChat(responder=respond))
    await run_jobs(graph, plan.jobs(), store, concurrency=2, show_progress=False)
    recorded = sum(total_tokens(r) for r in store.load())
    assert recorded > 0 and runner_progress[0].live_tokens() == recorded


async def test_each_question_left_is_priced_at_its_own_settings_mean() -> None:
    """A resumed run of 3 never and 3 always questions: the cheap never ones finish first.
    Priced at the finished questions' mean (100 tokens) the 4 left would cost nothing more than
    is in flight; priced by setting, with the folder's recorded always runs, 3,100 are left."""
    stream, clock, live = io.StringIO(), Clock(), [0]
    progress = RunProgress(
        6,
        stream=stream,
        every=1,
        interval=6000,
        clock=clock,
        live_tokens=lambda: live[0],
        settings=["critic/never/-"] * 3 + ["critic/always/-"] * 3,
        recorded=[("critic/always/-", 900), ("critic/always/-", 1_100), ("critic/never/-", 100)],
    )
    assert progress.tokens_left() == 3 * 100 + 3 * 1_000
    async with progress:
        clock.now += 600
        live[0] = 600  # 1 tok/s; 400 of it spent on questions still in flight
        progress.finished_one(100, "critic/never/-")
        progress.finished_one(100, "critic/never/-")
    assert progress.tokens_left() == 100 + 3 * 1_000
    # 3,100 left less the 400 in flight, at 1 tok/s.
    assert stream.getvalue().splitlines()[2].endswith("elapsed 10m00s, ETA 45m00s")


def test_a_setting_with_nothing_finished_is_priced_at_the_mean_of_all() -> None:
    progress = RunProgress(3, settings=["a", "b", "b"], recorded=[("a", 300), ("c", 100)])
    assert progress.tokens_left() == 300 + 2 * 200  # b at the mean of a and c
    assert RunProgress(3).tokens_left() is None  # nothing to price by: the ETA counts questions


def test_settings_must_name_every_question() -> None:
    with pytest.raises(ValueError, match="2 settings given for 3 questions"):
        RunProgress(3, settings=["a", "b"])


async def test_run_jobs_prices_a_resumed_run_by_the_folders_records(
    tmp_path, runner_progress: list[RunProgress]
) -> None:
    """The runner tells the progress each job's setting and the folder's recorded costs."""
    plan = EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", limit=3)),
        gates=("never", "always"),
        settings={"max_steps": 2},
    )
    store = RecordStore(tmp_path)
    graph = build_graph(backbone=FakeLogprobChat(responder=respond))
    jobs = plan.jobs()
    await run_jobs(graph, jobs[:2], store, concurrency=1, show_progress=False)  # question 1
    cost = {r["gate"]: total_tokens(r) for r in store.load()}
    assert cost["always"] > cost["never"]
    await run_jobs(graph, jobs[2:], store, concurrency=1, show_progress=False)  # questions 2, 3
    assert runner_progress[1].priced_at_start == 2 * cost["never"] + 2 * cost["always"]


async def test_a_resumed_question_counts_only_what_this_run_made_as_spent() -> None:
    """Two questions in flight after a resume; one finishes at 1,000 tokens, 800 of them made
    before the resume. The live count's 300 are its 200 and 100 for the one still in flight,
    which is then expected to need 900 more, not 1,600."""
    stream, clock, live = io.StringIO(), Clock(), [0]
    async with RunProgress(
        2, stream=stream, every=1, interval=6000, clock=clock, live_tokens=lambda: live[0]
    ) as progress:
        clock.now += 300
        live[0] = 300  # 1 tok/s
        progress.finished_one(1_000, here=200)
    assert stream.getvalue().splitlines()[1].endswith("elapsed 5m00s, ETA 15m00s")
