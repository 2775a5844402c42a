"""Several traces of one question in the graph, against a scripted fake: the vote, exact
usage over every trace, the step events of each trace, the live stop rule, and the replay of
the same rule on recorded traces deciding exactly as the live run did."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from fakes import FakeLogprobChat, Scripted
from mur.evals.harness.run_record import JobKey, make_record
from mur.evals.report.traces import Question, question_traces, replay
from mur.experiments.parallel_traces import RULES
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve
from mur.graphs.state import OUTPUT_KEYS, Context, ContextError
from mur.nodes.voting import TraceRules

QUESTION = "What is 6 * 7?"


class Traces:
    """Scripted traces: the first step of the n-th trace started says `<tag n>`, so each later
    request knows its trace; trace n's plan is `plans[n]`: (uncertainty of each step, answer).
    The last planned step states the answer."""

    def __init__(self, plans: list[tuple[list[float], str]]) -> None:
        self.plans = plans
        self.started = itertools.count()
        self.generated = 0

    def __call__(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        kept = str(messages[-1].content)
        tags = re.findall(r"<tag (\d+)>", kept)
        trace = int(tags[0]) if tags else next(self.started)
        step = len(tags) + 1
        uncertainties, answer = self.plans[trace]
        m = uncertainties[step - 1]
        text = f"Step {step} <tag {trace}>"
        last = step == len(uncertainties)
        if last:
            text += f" so the answer is {answer}."
        logprobs = [-m] * 4
        self.generated += len(logprobs)
        tops = (
            [[("a", -m), ("b", -m - 1.0)] for _ in logprobs] if kwargs.get("top_logprobs") else None
        )
        return Scripted(text, logprobs, stop_reason=None if last else "\n\n", top_logprobs=tops)


def graph_for(plans: list[tuple[list[float], str]]) -> tuple[Any, Traces]:
    script = Traces(plans)
    return build_graph(backbone=FakeLogprobChat(responder=script)), script


def context(**settings: Any) -> Context:
    return Context(strategy="critic", gate="never", step_format="paragraph", **settings)


async def test_one_trace_is_the_plain_loop_with_one_summary() -> None:
    graph, script = graph_for([([0.5, 0.2], "42")])
    solution = await solve(graph, QUESTION, context=context())
    output = solution.output
    assert set(output) == set(OUTPUT_KEYS)
    assert output["answer"] == "42" and len(output["steps"]) == 2
    assert output["usage"]["backbone_tokens"] == script.generated == 8
    (summary,) = output["traces"]
    assert summary["index"] == 0 and summary["weight"] == 1.0 and not summary["stopped"]
    assert summary["tokens"] == 8 and summary["confidence"] is None
    assert [event["trace"] for event in solution.steps] == [0, 0]


async def test_the_majority_answer_with_usage_over_every_trace() -> None:
    plans = [([0.5, 0.5], "7"), ([0.5, 0.2], "42"), ([0.5], "42")]
    graph, script = graph_for(plans)
    solution = await solve(graph, QUESTION, context=context(traces=3, top_logprobs=2))
    output = solution.output
    assert output["answer"] == "42"
    assert output["usage"]["backbone_tokens"] == script.generated == 20
    assert output["usage"]["llm_calls"] == 5
    summaries = output["traces"]
    assert sorted(s["index"] for s in summaries) == [0, 1, 2]
    assert sum(s["tokens"] for s in summaries) == 20
    assert all(s["confidence"] is not None for s in summaries)
    # The steps shown are a trace that gave the answer; every trace streamed its steps.
    assert "42" in output["steps"][-1]["text"]
    assert sorted(event["trace"] for event in solution.steps) == [0, 0, 1, 1, 2]
    assert all(len(step["confidences"]) == 4 for step in output["steps"])


async def test_the_momentum_vote_follows_the_surest_trace() -> None:
    plans = [([9.0, 9.0], "7"), ([9.0, 9.0], "7"), ([0.1, 0.1], "42")]
    majority = await graph_for(plans)[0].ainvoke({"question": QUESTION}, context=context(traces=3))
    weighted = await graph_for(plans)[0].ainvoke(
        {"question": QUESTION}, context=context(traces=3, vote="momentum")
    )
    assert (majority["answer"], weighted["answer"]) == ("7", "42")


ESC_PLANS = [
    ([0.5, 0.5], "1"),  # warm-up: final momentum 0.095
    ([0.4, 0.4], "2"),  # warm-up: 0.076; disagrees, so a second batch is drawn
    ([2.0, 2.0, 2.0], "3"),  # momentum 0.2 after step 1 > 0.095: stopped there
    ([0.3, 0.3], "1"),  # finishes; the batch has one answer, so a third batch is drawn
    ([0.2, 0.2], "1"),
    ([0.2, 0.2], "1"),  # the third batch agrees: settled after 6 traces
    ([0.2, 0.2], "5"),
    ([0.2, 0.2], "5"),
]


async def test_mur_esc_live_stops_traces_and_settles() -> None:
    graph, script = graph_for(ESC_PLANS)
    rules = {"traces": 8, "trace_batch": 2, "settle": "agree", "trace_stop": "momentum"}
    output = await graph.ainvoke({"question": QUESTION}, context=context(**rules, stop_keep=1.0))
    summaries = {s["index"]: s for s in output["traces"]}
    assert sorted(summaries) == [0, 1, 2, 3, 4, 5]
    assert summaries[2]["stopped"] and summaries[2]["finish_reason"] == "stopped"
    assert summaries[2]["steps"] == 1 and summaries[2]["weight"] == 0.0
    assert not any(s["stopped"] for i, s in summaries.items() if i != 2)
    assert output["answer"] == "1"
    assert output["usage"]["backbone_tokens"] == script.generated == 11 * 4


async def test_the_replay_on_recorded_traces_decides_as_the_live_run() -> None:
    """The same eight traces run in full and recorded, then mur-esc replayed on them: the
    answer, the traces drawn and stopped, and the tokens are the live run's."""
    question = await recorded_question(ESC_PLANS)
    result = replay(question, RULES["mur-esc"].rules(8))
    assert (result.correct, result.drawn, result.stopped, result.tokens) == (True, 6, 1, 11 * 4)


async def recorded_question(plans: list[tuple[list[float], str]]) -> Question:
    """Each plan run alone in full and recorded as one sample of a question whose answer is 1."""
    records = []
    for sample, plan in enumerate(plans):
        graph, _ = graph_for([plan])
        output = await graph.ainvoke({"question": QUESTION}, context=context())
        key = JobKey("math500", "q1", "critic", "never", None, sample)
        records.append(make_record(key, "1", output, output["answer"] == "1", 0.1))
    (question,), incomplete = question_traces(records)
    assert incomplete == []
    return question


STATISTICAL_STOPS = {
    "ESC, window 4": {"trace_batch": 4, "settle": "agree"},
    "Beta stop": {"trace_batch": 1, "settle": "beta", "beta_confidence": 0.9},
    "doubling": {"trace_batch": 2, "settle": "doubling", "consensus": 0.6},
    "mur-esc": {"trace_batch": 2, "settle": "agree", "trace_stop": "momentum", "stop_keep": 1.0},
}


@pytest.mark.parametrize("name", list(STATISTICAL_STOPS))
async def test_each_settle_rule_replays_as_it_ran_live(name: str) -> None:
    """Every settle rule, run live and replayed on the same traces recorded alone, with the
    rules the live run's Context gives: the same traces drawn and stopped, tokens, answer."""
    answers = ["1", "2", "1", "1", "1", "1", "1", "1", "5", "5", "5", "5"]
    plans = [([0.3 + 0.1 * (i % 3), 0.3], answer) for i, answer in enumerate(answers)]
    settings = context(traces=12, **STATISTICAL_STOPS[name])
    graph, script = graph_for(plans)
    output = await graph.ainvoke({"question": QUESTION}, context=settings)
    replayed = replay(await recorded_question(plans), settings.trace_rules())
    live_stopped = sum(s["stopped"] for s in output["traces"])
    assert (replayed.drawn, replayed.stopped) == (len(output["traces"]), live_stopped)
    assert replayed.tokens == output["usage"]["backbone_tokens"] == script.generated
    assert replayed.correct == (output["answer"] == "1")
    assert 2 <= replayed.drawn < 12  # each rule settled before drawing every trace


def test_trace_settings_that_cannot_work_are_refused_in_one_line() -> None:
    with pytest.raises(ContextError, match="top_logprobs"):
        Context(traces=4, vote="confidence")
    with pytest.raises(ContextError, match="trace_batch below traces"):
        Context(traces=4, trace_stop="momentum")
    with pytest.raises(ContextError, match="trace_batch below traces"):
        Context(traces=4, trace_batch=4, settle="agree")
    with pytest.raises(ContextError, match="traces must"):
        Context(traces=0)


SURE, UNSURE = [("a", -0.01), ("b", -9.0)], [("a", -1.0), ("b", -1.2)]  # C = 4.505, 1.1


class Unsure(Traces):
    """Traces whose tokens are all sure, but for `unsure[trace]`: the token indices (within
    step 1) where the model hesitates."""

    def __init__(self, plans: list[tuple[list[float], str]], unsure: dict[int, set[int]]) -> None:
        super().__init__(plans)
        self.unsure = unsure

    def __call__(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        scripted = super().__call__(messages, kwargs)
        trace = int(re.findall(r"<tag (\d+)>", scripted.text)[0])
        step = len(re.findall(r"<tag \d+>", str(messages[-1].content))) + 1
        hesitant = self.unsure.get(trace, set()) if step == 1 else set()
        scripted.top_logprobs = [
            UNSURE if i in hesitant else SURE for i in range(len(scripted.logprobs))
        ]
        return scripted


async def test_deepconf_online_stops_a_trace_mid_step_and_the_stream_with_it() -> None:
    """A trace after the warm-up whose group confidence falls below the warm-up's lowest is
    cut at that token: its stream is closed (the fake yields no further token), it costs the
    tokens read, has no vote, and the replay on the full traces decides the same."""
    plans = [([0.3, 0.3], "1"), ([0.3, 0.3], "2"), ([0.3, 0.3], "3"), ([0.3, 0.3], "1")]
    unsure = {2: {2, 3}}  # trace 2: tokens 3 and 4 of step 1 hesitate
    script = Unsure(plans, unsure)
    model = FakeLogprobChat(responder=script)
    settings = {"traces": 4, "trace_batch": 2, "trace_stop": "confidence", "stop_keep": 1.0}
    ctx = context(**settings, top_logprobs=2, group_window=2)
    output = await build_graph(backbone=model).ainvoke({"question": QUESTION}, context=ctx)
    summaries = {s["index"]: s for s in output["traces"]}
    assert summaries[2]["stopped"] and summaries[2]["tokens"] == 3  # cut at its 3rd token
    assert [s["stopped"] for i, s in sorted(summaries.items()) if i != 2] == [False] * 3
    assert output["answer"] == "1"
    # The stream stopped where the watch did: 3 tokens of trace 2's 4 were ever generated.
    assert model.streamed_tokens == 3 + 2 * 4  # trace 2's cut step, trace 3's two steps
    assert output["usage"]["backbone_tokens"] == 4 * 8 - 5
    # Replayed on the four traces run in full, DeepConf online decides the same.
    records = []
    for sample in range(4):
        solo = FakeLogprobChat(responder=Unsure([plans[sample]], {0: unsure.get(sample, set())}))
        full = await build_graph(backbone=solo).ainvoke(
            {"question": QUESTION}, context=context(top_logprobs=2, group_window=2)
        )
        key = JobKey("math500", "q1", "critic", "never", None, sample)
        records.append(make_record(key, "1", full, full["answer"] == "1", 0.1))
    (question,), _ = question_traces(records)
    rules = TraceRules(
        traces=4, trace_batch=2, trace_stop="confidence", stop_keep=1.0, group_window=2
    )
    result = replay(question, rules)
    assert (result.correct, result.drawn, result.stopped, result.tokens) == (True, 4, 1, 27)
