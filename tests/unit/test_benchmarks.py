"""benchmarks/: counters, request recording and replay planning, analyses, tables, report."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from mur.benchmarks import measure, trace_time
from mur.benchmarks.analysis import (
    ClientTime,
    client_time,
    max_cache_hit,
    speed_normalized,
    step_of,
    step_prompt_rows,
)
from mur.benchmarks.counters import Counters, add_counters, parse_block_size, parse_counters, ratio
from mur.benchmarks.recording import (
    RecordedRequest,
    forced_length,
    plan_waves,
    recorded_request,
    replay_bodies,
    replay_body,
)
from mur.benchmarks.report import NOTES_MARKER, merge_notes, render
from mur.benchmarks.results import GraphRun, NChoiceRun, RawRun, ReplayRun
from mur.benchmarks.tables import (
    economy_table,
    markdown_table,
    overhead_table,
    scaling_table,
    verdict,
)
from mur.cli.bench import economy
from mur.cli.bench import trace_time as trace_time_command
from mur.servers.clients.errors import ServerError
from mur.servers.processes.facts import ServerFacts

METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 240.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.79e+09
vllm:prompt_tokens_total{engine="0",model_name="m"} 360.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 360.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 600.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 120.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 6.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 200.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0"} 1.0
"""


def body(messages: list[dict[str, str]], n: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": messages,
        "logprobs": True,
        "max_completion_tokens": 96,
        "stop": ["\nStep", "Step3:"],
        "stream": False,
        **({"n": n} if n > 1 else {}),
        **extra,
    }


def draft_body(step: int, prefix: str = "") -> dict[str, Any]:
    content = f"{prefix}Step{step}:" if not prefix else f"{prefix}\nStep{step}:"
    return body([{"role": "user", "content": "q"}, {"role": "assistant", "content": content}])


def request(
    question: int,
    start: float,
    end: float,
    *,
    tokens: tuple[int, ...] = (10,),
    prompt: int = 100,
    payload: dict[str, Any] | None = None,
    hits: float | None = None,
) -> RecordedRequest:
    payload = payload or body([{"role": "user", "content": "q"}], n=len(tokens))
    return RecordedRequest(
        question, start, end, payload, tokens, sum(tokens), prompt, cache_hits=hits
    )


# --- counters ------------------------------------------------------------------------------


def test_parse_counters_reads_vllm_metrics() -> None:
    c = parse_counters(METRICS)
    assert c.generation_tokens == 240 and c.prompt_tokens == 360
    assert c.hit_rate == pytest.approx(128 / 360)
    assert c.tokens_per_step == 5
    assert c.inter_token_s == pytest.approx(0.03)
    assert c.requests_waiting is None  # not in this text: missing, never 0
    assert parse_block_size(METRICS) == 128
    assert parse_block_size("vllm:other 1") is None


def test_counter_differences_and_sums_keep_missing_as_none() -> None:
    a = Counters(generation_tokens=10, cache_hits=None)
    b = Counters(generation_tokens=4, cache_hits=2)
    assert (a - b).generation_tokens == 6 and (a - b).cache_hits is None
    assert add_counters(a, b).generation_tokens == 14
    assert Counters().hit_rate is None


def test_ratio_verdict_and_markdown() -> None:
    assert ratio(1, 0) is None and ratio(None, 2) is None and ratio(3, 2) == 1.5
    assert verdict(0.5, 0.55, at_most=True) == "met"
    assert verdict(0.9, 0.8, at_most=False) == "met"
    assert verdict(0.7, 0.8, at_most=False) == "missed"
    assert verdict(None, 1, at_most=True) == "not measured"
    table = markdown_table(["a", "b"], [[1, "x|y"]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]


def test_speed_normalized_factors_out_the_servers_speed() -> None:
    slow, fast = Counters(itl_sum=2.0, itl_count=20), Counters(itl_sum=1.0, itl_count=20)
    # Twice the wall time on a server twice as slow per token: no overhead.
    assert speed_normalized(20.0, slow, 10.0, fast) == pytest.approx(1.0)
    assert speed_normalized(20.0, Counters(), 10.0, fast) is None


# --- recording and replay --------------------------------------------------------------------


def test_recorded_request_counts_tokens_per_choice() -> None:
    reply = {
        "choices": [
            {"logprobs": {"content": [{"logprob": -1}] * 3}},
            {"logprobs": {"content": [{"logprob": -1}] * 5}},
        ],
        "usage": {"completion_tokens": 8, "prompt_tokens": 40},
    }
    r = recorded_request(2, 1.0, 2.0, json.dumps(body([], n=2)).encode(), json.dumps(reply))
    assert (r.question, r.n, r.choice_tokens, r.completion_tokens, r.prompt_tokens) == (
        2,
        2,
        (3, 5),
        8,
        40,
    )
    no_logprobs = {"choices": [{}, {}], "usage": {"completion_tokens": 8}}
    assert recorded_request(0, 0, 1, body([]), no_logprobs).choice_tokens == (4, 4)


def test_forced_length_spreads_the_recorded_tokens_over_choices() -> None:
    assert forced_length(request(0, 0, 1, tokens=(3, 5, 4, 4))) == 4
    assert forced_length(request(0, 0, 1, tokens=(3, 6))) == 5  # rounded up
    assert forced_length(request(0, 0, 1, tokens=(0,))) == 1  # a request generates >= 1


def test_replay_body_forces_lengths_and_keeps_the_request() -> None:
    original = request(0, 0, 1, tokens=(7,), payload=draft_body(2, "Step1: x"))
    sent = replay_body(original, "salt-1")
    assert sent["max_tokens"] == sent["min_tokens"] == 7 and sent["ignore_eos"] is True
    assert sent["cache_salt"] == "salt-1"
    assert "max_completion_tokens" not in sent and "stream" not in sent
    assert sent["messages"] == original.body["messages"] and sent["stop"] == original.body["stop"]
    assert "min_tokens" not in original.body  # the recording is untouched


def test_plan_waves_keeps_order_and_concurrency_per_question() -> None:
    requests = [
        request(1, 0.0, 1.0),  # q1: draft
        request(0, 0.0, 2.0),  # q0: draft
        request(0, 2.1, 3.0),  # q0: candidates
        request(0, 3.1, 4.0),  # q0: 3 judges sent together ...
        request(0, 3.1, 4.5),
        request(0, 3.2, 4.2),
        request(0, 4.6, 5.0),  # ... then the next draft, after they answered
        request(1, 1.1, 2.0),
    ]
    plan = plan_waves(requests)
    assert [[len(w) for w in q] for q in plan] == [[1, 1, 3, 1], [1, 1]]
    assert [r.start for r in plan[0][2]] == [3.1, 3.1, 3.2]


def test_plan_waves_splits_a_request_sent_after_an_answer() -> None:
    # The second request started after the first answered: it may depend on it.
    plan = plan_waves([request(0, 0.0, 1.0), request(0, 0.5, 3.0), request(0, 1.5, 2.0)])
    assert [[r.start for r in w] for w in plan[0]] == [[0.0, 0.5], [1.5]]


def test_client_time_is_question_time_outside_the_request_waves() -> None:
    requests = [request(0, 1.0, 2.0), request(0, 2.5, 4.0), request(0, 2.5, 3.0)]
    ct = client_time(requests, {0: (0.8, 4.2)})
    assert ct == ClientTime(1, pytest.approx(3.4), pytest.approx(2.5), pytest.approx(0.9), 2)
    assert ct.between_per_wave_ms == pytest.approx(450)


def test_step_of_recognizes_step_drafts_only() -> None:
    assert step_of(draft_body(1)) == 1
    assert step_of(draft_body(3, "Step1: a\nStep2: b")) == 3
    judge = body([{"role": "user", "content": "You are a teacher... Step2:"}])
    assert step_of(judge) is None
    candidates = {**draft_body(2, "Step1: a"), "n": 4}
    assert step_of(candidates) is None
    revision = body(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "Step1: a\nStep2: b"},
            {"role": "user", "content": "Your previous solution is incorrect."},
            {"role": "assistant", "content": "Step1: a\nStep2:"},
        ]
    )
    assert step_of(revision) is None
    fallback = body(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Therefore, the"}]
    )
    assert step_of(fallback) is None


def test_step_prompt_rows_measure_growth_and_recomputation() -> None:
    requests = [
        request(0, 0, 1, prompt=140, payload=draft_body(1), hits=0),
        request(0, 1, 2, prompt=170, payload=draft_body(2, "Step1: a"), hits=128),
        request(1, 0, 1, prompt=100, payload=draft_body(1), hits=0),
        request(1, 1, 2, prompt=140, payload=draft_body(2, "Step1: b"), hits=0),
        request(1, 2, 3, prompt=150, payload=body([{"role": "user", "content": "judge"}])),
    ]
    rows = step_prompt_rows(requests)
    assert [(r.step, r.requests) for r in rows] == [(1, 2), (2, 2)]
    assert rows[0].growth is None and rows[0].recomputed == 120
    assert rows[1].prompt_tokens == 155 and rows[1].growth == 35
    assert rows[1].cache_hits == 64 and rows[1].recomputed == 91


# --- tables ----------------------------------------------------------------------------------


def graph_run(gate: str, total: int, **kw: Any) -> GraphRun:
    run = GraphRun(f"critic/{gate}", "critic", gate, 8, 4, backbone_tokens=total, **kw)
    run.server = Counters(generation_tokens=total)
    return run


def test_economy_table_ratios_and_goal() -> None:
    runs = [
        graph_run("mur", 400, steps_scaled=2, steps_total=10, scaled_by_step={2: (2, 4)}),
        graph_run("always", 1000, steps_scaled=10, steps_total=10),
        graph_run("never", 200),
    ]
    table, goals = economy_table(runs)
    assert "| critic | mur | 4 | 400 |" in table and "0.40x | 2.00x |" in table
    assert len(goals) == 1 and "MUR / always = 0.40x" in goals[0] and "**met**" in goals[0]
    assert "t=2: 2/4" in goals[0]
    runs[0].backbone_tokens = 800
    assert "**missed**" in economy_table(runs)[1][0]


def test_overhead_table_pools_runs() -> None:
    g = graph_run("mur", 100)
    g.wall_s, g.spans = 11.0, {0: (0.0, 11.0)}
    g.requests = [request(0, 0.5, 10.5)]
    g.server = Counters(generation_tokens=100, itl_sum=1.1, itl_count=10)
    r = ReplayRun("critic/mur", 10.0, 0.1, Counters(itl_sum=1.0, itl_count=10), 1)
    table, goals = overhead_table([(g, r)])
    assert "1.10x" in table and "all runs pooled" in table
    assert "**missed**" in goals[0]  # 1.10x on the wall clock ...
    assert "1.00x (**met**)" in goals[0]  # ... but the server was 10% slower meanwhile
    assert "9.09%" in goals[1] and "1.10x" in goals[1]  # 1 s of 11 between requests


def test_scaling_table_goal_only_from_eight() -> None:
    pairs = []
    for level, tps in ((1, 30.0), (8, 90.0)):
        g = graph_run("mur", 0)
        g.concurrency, g.wall_s, g.window_s = level, 10.0, 5.0
        g.server = Counters(generation_tokens=tps * 10)
        g.window = Counters(generation_tokens=tps * 5, step_tokens=50, steps=10)
        pairs.append((g, RawRun(level, 10.0, Counters(generation_tokens=1000), 9)))
    table, goals = scaling_table(pairs)
    assert len(goals) == 1 and "0.90x" in goals[0] and "**met**" in goals[0]
    assert "| 1 | 4 | 30.0 | 30.0 | 100.0 | 0.30x |" in table


def test_merge_notes_keeps_hand_written_notes() -> None:
    first = merge_notes("# T\nv1", None)
    assert first.endswith(f"{NOTES_MARKER}\n")
    edited = first + "\nMy analysis.\n"
    second = merge_notes("# T\nv2", edited)
    assert second.startswith("# T\nv2") and second.endswith("My analysis.\n")
    assert second.count(NOTES_MARKER) == 1


# --- the replay against a fake OpenAI client --------------------------------------------------


class FakeServer:
    async def counters(self) -> Counters:
        return Counters(generation_tokens=0)

    async def idle(self, timeout: float = 60) -> None:
        return None


class FakeAsyncOpenAI:
    """Answers after a short sleep; logs (question, when it was sent, when answered), each
    moment the number of the event among all sends and answers: the order, not a clock."""

    log: ClassVar[list[tuple[str, int, int]]] = []
    events: ClassVar[Iterator[int]] = itertools.count()

    def __init__(self, **_: Any) -> None:
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, *, model: str, messages: list, extra_body: dict) -> Any:
        start = next(FakeAsyncOpenAI.events)
        await asyncio.sleep(0.01 * extra_body["max_tokens"])
        FakeAsyncOpenAI.log.append((messages[0]["content"], start, next(FakeAsyncOpenAI.events)))
        return None

    async def close(self) -> None:
        return None


async def test_replay_keeps_each_questions_order_and_the_concurrency(monkeypatch) -> None:
    import openai

    monkeypatch.setattr(openai, "AsyncOpenAI", FakeAsyncOpenAI)
    FakeAsyncOpenAI.log = []

    def req(q: int, start: float, end: float, tokens: int) -> RecordedRequest:
        payload = body([{"role": "user", "content": f"q{q}"}])
        return RecordedRequest(q, start, end, payload, (tokens,), tokens, 10)

    requests = []
    for q in range(3):  # per question: a draft, two concurrent judges, a draft
        requests += [req(q, 0, 1, 2), req(q, 1.1, 2, 1), req(q, 1.1, 2, 3), req(q, 2.1, 3, 1)]
    run = GraphRun("x", "critic", "mur", 2, 3, requests=requests)
    b = measure.Bench(FakeServer(), measure.Settings(), [])  # type: ignore[arg-type]
    b.server.base_url = "http://fake/v1"  # type: ignore[attr-defined]
    replay = await b.replay(run)
    assert replay.requests == 12 and len(FakeAsyncOpenAI.log) == 12
    for q in range(3):
        mine = sorted((s, e) for c, s, e in FakeAsyncOpenAI.log if c == f"q{q}")
        (_, e0), (s1, e1), (s2, e2), (s3, _e3) = mine
        assert s1 > e0 and s2 > e0  # the judges wait for the draft ...
        assert s2 < min(e1, e2)  # ... and go together: both sent before either answers
        assert s3 > max(e1, e2)  # the next draft waits for both
    # Never more than 2 questions at once: q2 starts after q0 or q1 finished.
    first_q2 = min(s for c, s, _ in FakeAsyncOpenAI.log if c == "q2")
    last = {c: max(e for c2, _, e in FakeAsyncOpenAI.log if c2 == c) for c in ("q0", "q1")}
    assert first_q2 > min(last.values())


def test_bad_arguments_exit_2_before_any_server(capsys) -> None:
    assert economy.main(["--strategies", "nope"]) == 2
    assert economy.main(["--questions", "1"]) == 2
    assert economy.main(["--max-steps", "0"]) == 2
    assert "error:" in capsys.readouterr().err


def test_max_cache_hit_is_whole_blocks_short_of_the_last_token() -> None:
    assert max_cache_hit(300, 128) == 256
    assert max_cache_hit(256, 128) == 128  # the last token is always computed
    assert max_cache_hit(100, 128) == 0
    assert max_cache_hit(100, None) is None
    rows = step_prompt_rows([request(0, 0, 1, prompt=300, payload=draft_body(1), hits=256)], 128)
    assert rows[0].max_hits == 256


def test_replay_bodies_send_each_choice_of_n_at_its_own_length() -> None:
    candidates = {**draft_body(2, "Step1: a"), "n": 3}
    r = request(0, 0, 1, tokens=(5, 9, 2), payload=candidates)
    sent = replay_bodies(r, "s")
    assert [(b["max_tokens"], b["min_tokens"], "n" in b) for b in sent] == [
        (5, 5, False),
        (9, 9, False),
        (2, 2, False),
    ]
    assert all(b["messages"] == candidates["messages"] for b in sent)
    single = request(0, 0, 1, tokens=(7,), payload=draft_body(1))
    assert [b["max_tokens"] for b in replay_bodies(single, "s")] == [7]


def test_gate_labels_add_their_settings() -> None:
    assert measure.Settings().context("random@0.2").random_rate == 0.2
    ctx = measure.Settings().context("mur+bc")
    assert ctx.gate == "mur" and ctx.bias_correction is True
    assert measure.Settings().context("always").bias_correction is False
    assert economy.main(["--gates", "nope+bc"]) == 2


def test_economy_goal_lines_for_every_mur_variant() -> None:
    runs = [graph_run("mur", 700), graph_run("always", 1000), graph_run("never", 200)]
    runs.insert(1, graph_run("mur+bc", 400))
    goals = economy_table(runs)[1]
    assert len(goals) == 2
    assert "critic, mur: MUR / always = 0.70x" in goals[0] and "**missed**" in goals[0]
    assert "critic, mur+bc: mur+bc / always = 0.40x" in goals[1] and "**met**" in goals[1]


def test_scaling_batch_fill_is_sequences_per_engine_step() -> None:
    g = graph_run("mur", 0)
    g.concurrency, g.wall_s, g.window_s = 8, 10.0, 5.0
    g.window = Counters(generation_tokens=300, steps=50)  # 6 sequences per step
    raw = RawRun(8, 10.0, Counters(generation_tokens=1000, steps=125), 9)  # 8 per step
    table, goals = scaling_table([(g, raw)])
    assert "6.00 / 8.00 | 0.75x" in table
    assert "Batch fill, graph / raw = 0.75x (**missed**)" in goals[0]


def test_merge_notes_keeps_the_notes_under_the_old_marker() -> None:
    old = "<!-- notes: everything below this line is kept when evals.bench rewrites the file -->"
    merged = merge_notes("# T\nv2", f"# T\nv1\n\n{old}\n\nMy analysis.\n")
    assert merged == f"# T\nv2\n\n{NOTES_MARKER}\n\nMy analysis.\n"


def test_render_has_every_table_and_goal_and_no_prose() -> None:
    mur = graph_run("mur", 400, steps_scaled=2, steps_total=10)
    mur.wall_s, mur.spans, mur.requests = 11.0, {0: (0.0, 11.0)}, [request(0, 0.5, 10.5)]
    runs = [mur, graph_run("always", 1000), graph_run("never", 200)]
    replay = ReplayRun("critic/mur", 10.0, 0.1, Counters(itl_sum=1.0, itl_count=10), 1)
    scaled = graph_run("mur", 0)
    scaled.concurrency, scaled.wall_s, scaled.window_s = 8, 10.0, 5.0
    scaled.window = Counters(generation_tokens=450, steps=60)
    sequential = graph_run("mur", 100)
    sequential.requests = [request(0, 0, 1, prompt=140, payload=draft_body(1), hits=0)]
    out = {
        "economy": runs,
        "overhead": [(mur, replay)],
        "scaling": [(scaled, RawRun(8, 10.0, Counters(generation_tokens=1000, steps=125), 9))],
        "n_choices": [NChoiceRun("one request: n=4", 1.5, Counters(generation_tokens=384))],
        "sequential": sequential,
        "block_size": 128,
    }
    text = render(out, measure.Settings(), "mur bench economy", {"Machine": "m"})
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert len(headings) == 8 and headings[1].startswith("## 1. Token economy (8 MATH-500")
    assert "- Command: `mur bench economy`" in text and "- Machine: m" in text
    assert "MUR / always = 0.40x" in text and "Pooled graph / replay" in text
    assert "8 questions in flight: graph / raw" in text and "| one request: n=4 |" in text
    longest = max(len(line) for line in text.splitlines() if not line.startswith("|"))
    assert longest < 400  # explanations live in BENCHMARKS.md's notes, not in the code


def test_trace_time_refuses_an_offset_past_the_questions_before_starting_a_server(
    capsys, monkeypatch
) -> None:
    def no_server(*args, **kwargs):
        raise AssertionError("no server may be started for bad input")

    monkeypatch.setattr(trace_time_command, "connect", no_server)
    assert trace_time_command.main(["--offset", "100000"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{trace_time_command.PROG}: error: offset 100000 skips every question of math500, "
        "which has 500: give an offset below 500; see --help"
    ]


def timed(problem_id: str, arm: str) -> trace_time.Timed:
    return trace_time.Timed(arm, problem_id, 1.5, 100, 100, 40, 2, 1, [1.0, 1.5])


def facts_of(**changed: Any) -> ServerFacts:
    base = {
        "base_url": "http://127.0.0.1:8022/v1", "model": "m", "vllm_version": "0.32.0",
        "dtype": "bfloat16", "weights": "bf16", "logprobs_mode": "processed_logprobs",
        "cpu": "AMD EPYC (family 25, model 17)", "cpu_flags": ("avx512_bf16",),
    }  # fmt: skip
    return ServerFacts(**{**base, **changed})


def test_trace_time_rotates_the_arms_and_skips_what_an_earlier_run_timed() -> None:
    arms = ["a", "b", "c"]
    assert trace_time.schedule(["q1", "q2"], arms, []) == [
        ("q1", "a"), ("q1", "b"), ("q1", "c"), ("q2", "b"), ("q2", "c"), ("q2", "a"),
    ]  # fmt: skip
    done = [timed("q1", "b"), timed("q2", "b")]
    assert trace_time.schedule(["q1", "q2"], arms, done) == [
        ("q1", "a"), ("q1", "c"), ("q2", "c"), ("q2", "a"),
    ]  # fmt: skip


def test_trace_time_resumes_only_the_same_plan_on_the_same_kind_of_server(tmp_path) -> None:
    out, plan = tmp_path / "trace_time.json", {"dataset": "math500", "offset": 200}
    assert trace_time.resume(out, facts_of(), plan) == []
    runs = [timed("q1", "a"), timed("q1", "b")]
    trace_time.save(out, facts_of(), plan, runs)
    assert trace_time.resume(out, facts_of(base_url="http://other:8022/v1"), plan) == runs
    with pytest.raises(ValueError, match=r"this server is vLLM 0\.32\.0, float32.*dtype differ"):
        trace_time.resume(out, facts_of(dtype="float32"), plan)
    with pytest.raises(ValueError, match=r"\(cpu differ\): one table times one kind of server"):
        trace_time.resume(out, facts_of(cpu="Intel Xeon"), plan)
    with pytest.raises(ValueError, match=r"with offset=200, this command asks offset=0: rerun"):
        trace_time.resume(out, facts_of(), {**plan, "offset": 0})
    trace_time.save(out, facts_of(), {**plan, "settings": {"max_steps": 2}}, runs)
    with pytest.raises(ValueError, match=r"max_steps=2, this command asks max_steps=3: rerun"):
        trace_time.resume(out, facts_of(), {**plan, "settings": {"max_steps": 3}})
    with pytest.raises(ValueError, match=r"max_steps=2, this .* \(and 1 more settings\)"):
        trace_time.resume(out, facts_of(), {**plan, "offset": 0, "settings": {"max_steps": 3}})
    out.write_text('{"runs": [{"arm": "a"}]}')
    with pytest.raises(ValueError, match="is not a trace_time result"):
        trace_time.resume(out, facts_of(), plan)


def test_trace_time_refuses_an_out_it_cannot_write_before_starting_a_server(
    capsys, monkeypatch, tmp_path
) -> None:
    no_server = lambda *a, **k: pytest.fail("no server for bad input")  # noqa: E731
    monkeypatch.setattr(trace_time_command, "connect", no_server)
    assert trace_time_command.main(["--out", str(tmp_path / "missing" / "t.json")]) == 2
    assert "give a file in a folder that exists" in capsys.readouterr().err


def test_trace_time_refuses_top_logprobs_eager_cannot_read_before_starting_a_server(
    capsys, monkeypatch
) -> None:
    monkeypatch.setattr(trace_time_command, "connect", lambda *a, **k: pytest.fail("no server"))
    assert trace_time_command.main(["--top-logprobs", "0"]) == 2
    assert "branch eager reads token entropies: set top_logprobs" in capsys.readouterr().err


class CountingServer:
    """A server's counters as trace_time reads them, and a graph whose run moves them."""

    def __init__(self, drawn: int, generated: int) -> None:
        self.drawn, self.generated, self.counter, self.prompts = drawn, generated, 1000, 50

    async def astream(self, state: dict, *, context: Any, stream_mode: list[str]):
        assert stream_mode == ["updates", "values"]
        traces = [{"index": 1, "parent": 0}, {"index": 0, "parent": None}]  # finishing order
        for summary in traces:
            yield "updates", {"trace": {"drawn": [summary], "outputs": [{}]}}
        self.counter += self.generated
        self.prompts += 300
        usage = {"backbone_tokens": self.drawn, "external_tokens": 0, "failed_calls": 0}
        yield "values", {"question": state["question"], "usage": usage, "traces": traces}

    def generation_tokens(self, url: str) -> int:
        return self.counter

    def prompt_tokens(self, url: str) -> int:
        return self.prompts


def test_trace_time_keeps_a_run_only_when_it_had_the_server_to_itself(monkeypatch) -> None:
    question = SimpleNamespace(id="q7", question="What is 1 + 1?")

    def solving(server: CountingServer):
        monkeypatch.setattr(trace_time, "generation_tokens", server.generation_tokens)
        monkeypatch.setattr(trace_time, "prompt_tokens", server.prompt_tokens)
        monkeypatch.setattr(trace_time, "settled", lambda read, quiet: read())
        return trace_time.solve_alone(server, "MUR branching", question, {}, ["http://s/v1"])

    run = asyncio.run(solving(CountingServer(drawn=120, generated=120)))
    assert (run.tokens, run.server_tokens, run.prompt_tokens) == (120, 120, 300)
    assert (run.traces, run.branched) == (2, 1)
    assert len(run.finished_s) == 2 and run.finished_s[1] <= run.finished_s[0]
    with pytest.raises(trace_time.NotAlone, match=r"q7 MUR branching: the server at "
                       r"http://s/v1 generated 150 tokens while the run drew 120"):  # fmt: skip
        asyncio.run(solving(CountingServer(drawn=120, generated=150)))


def test_trace_time_waiting_is_the_time_a_round_waits_for_its_last_trace() -> None:
    def run(arm: str, finished: list[float]) -> trace_time.Timed:
        return trace_time.Timed(arm, "q", 30.0, 900, 900, 0, len(finished), 0, finished)

    assert trace_time.waiting(run("majority@8", [4.0, 9.0, 5.0, 6.0])) == 5.0  # one round
    # rounds of two: (2, 3) then (4, 8) then (9)
    assert trace_time.waiting(run("MUR branching", [2.0, 3.0, 8.0, 4.0, 9.0])) == 5.0
    assert trace_time.waiting(run("mur-esc", [])) == 0.0
    assert "| waiting s / question |" in trace_time.table([run("mur-esc", [1.0, 3.0])], ["mur-esc"])


def test_trace_time_compares_only_the_questions_every_arm_timed() -> None:
    """A stopped run leaves a question timed by some arms: its runs stay out of the table,
    else a mean over a hard extra question would set one arm's ratio."""
    arms = ["majority@8", "mur-esc"]
    runs = [timed("q1", arms[0]), timed("q1", arms[1])]
    runs.append(trace_time.Timed(arms[0], "q2", 900.0, 9000, 9000, 0, 8, 0, [900.0]))
    assert trace_time.paired(runs, arms) == runs[:2]
    text = trace_time.table(runs, arms)
    assert "| majority@8 | 1 | 1.5 |" in text and "| mur-esc | 1 | 1.5 |" in text
    assert text.splitlines()[3].endswith("| 1.00x | 1.00x |")
    assert text.splitlines()[-1] == "Left out, not timed by every arm yet: q2"
    assert "Left out" not in trace_time.table(runs[:2], arms)


def test_trace_time_table_prints_an_out_files_runs_without_a_server(
    capsys, monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(trace_time_command, "connect", lambda *a, **k: pytest.fail("no server"))
    out = tmp_path / "trace_time.json"
    trace_time.save(
        out, facts_of(), {"offset": 200}, [timed("q1", a) for a in trace_time.TRACE_ARMS]
    )
    assert trace_time_command.main(["--table", "--out", str(out)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == (
        "4 runs timed alone on vLLM 0.32.0, bfloat16, bf16 weights on AMD EPYC (family 25, "
        "model 17)"
    )
    assert shown[1].startswith("| arm | questions |") and len(shown) == 7
    assert trace_time_command.main(["--table", "--out", str(tmp_path / "none.json")]) == 2
    assert f"--table reads the runs of --out FILE ({tmp_path / 'none.json'} does not exist)" in (
        capsys.readouterr().err
    )
    assert trace_time_command.main(["--table"]) == 2
    assert "--table reads the runs of --out FILE (none given)" in capsys.readouterr().err


def test_trace_time_stopped_by_ctrl_c_says_what_is_kept_and_exits_130(
    monkeypatch, tmp_path, capsys
) -> None:
    async def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(trace_time_command, "run", interrupted)
    out = tmp_path / "trace_time.json"
    assert trace_time_command.main(["--out", str(out)]) == 130
    assert capsys.readouterr().err == (
        "mur bench trace_time: stopped (Ctrl-C): the run in flight is not kept; the runs "
        f"timed before it are in {out}, the same command resumes\n"
    )


def test_trace_time_cascade_arms_are_refused_without_their_inputs_before_a_server(
    capsys, monkeypatch
) -> None:
    """The random arm needs MUR's rate, every cascade arm the external model's server: each is
    one line before any server is started; given both, the flags pass to the servers."""
    monkeypatch.delenv("MUR_VERIFIER_URL", raising=False)
    monkeypatch.delenv("MUR_VERIFIER_MODEL", raising=False)

    def no_server(**kwargs):
        raise ServerError(f"reached the servers with verifier {kwargs['verifier_profile']}")

    monkeypatch.setattr(trace_time_command, "connect", no_server)
    arms = ["--arms", "cascade-small,cascade-random", "--limit", "1"]
    assert trace_time_command.main(arms) == 2
    assert "arm cascade-random draws steps at random: give its rate with --random-rate" in (
        capsys.readouterr().err
    )
    assert trace_time_command.main([*arms, "--random-rate", "0.3"]) == 2
    assert "the cascade arms need the external model's server: give --verifier-url" in (
        capsys.readouterr().err
    )
    pair = ["--profile", "cpu-qwen-0.5b", "--verifier-profile", "cpu-qwen-1.5b"]
    assert trace_time_command.main([*arms, "--random-rate", "0.3", *pair]) == 2
    assert "reached the servers with verifier cpu-qwen-1.5b" in capsys.readouterr().err
    # The trace rules need no external model.
    assert trace_time_command.main(["--arms", "mur-esc", "--limit", "1"]) == 2
    assert "reached the servers with verifier None" in capsys.readouterr().err


class TwoServers:
    """Two servers' counters, and a graph whose run moves each by what it generated there."""

    URLS = ("http://small/v1", "http://large/v1")

    def __init__(self, small: int, large: int, drawn: tuple[int, int]) -> None:
        self.moves, self.drawn = dict(zip(self.URLS, (small, large), strict=True)), drawn
        self.counters = dict.fromkeys(self.URLS, 1000)

    async def astream(self, state: dict, *, context: Any, stream_mode: list[str]):
        for url, moved in self.moves.items():
            self.counters[url] += moved
        backbone, external = self.drawn
        usage = {"backbone_tokens": backbone, "external_tokens": external, "failed_calls": 0}
        yield "values", {"question": state["question"], "usage": usage, "traces": []}


def test_trace_time_counts_both_servers_of_a_cascade_arm(monkeypatch) -> None:
    """A run on two servers is kept only when their counters together moved by what it drew."""
    question = SimpleNamespace(id="q7", question="What is 1 + 1?")

    def solving(servers: TwoServers):
        monkeypatch.setattr(trace_time, "generation_tokens", servers.counters.__getitem__)
        monkeypatch.setattr(trace_time, "prompt_tokens", lambda url: 0)
        monkeypatch.setattr(trace_time, "settled", lambda read, quiet: read())
        settings = {"top_logprobs": 20}
        return trace_time.solve_alone(servers, "cascade-mur", question, settings, TwoServers.URLS)

    run = asyncio.run(solving(TwoServers(small=100, large=50, drawn=(100, 50))))
    assert (run.arm, run.tokens, run.server_tokens) == ("cascade-mur", 150, 150)
    with pytest.raises(trace_time.NotAlone, match=r"q7 cascade-mur: the servers at "
                       r"http://small/v1, http://large/v1 generated 170 tokens while the run "
                       r"drew 150"):  # fmt: skip
        asyncio.run(solving(TwoServers(small=100, large=70, drawn=(100, 50))))


def test_trace_time_resumes_only_with_the_same_external_models_server(tmp_path) -> None:
    out, plan = tmp_path / "trace_time.json", {"dataset": "math500", "offset": 100}
    runs = [timed("q1", "cascade-mur")]
    trace_time.save(out, facts_of(), plan, runs, verifier=facts_of(model="large"))
    assert trace_time.resume(out, facts_of(), plan, facts_of(model="large")) == runs
    with pytest.raises(ValueError, match="was timed with a verifier server and this run is "
                       "without one"):  # fmt: skip
        trace_time.resume(out, facts_of(), plan)
    with pytest.raises(ValueError, match=r"this verifier is .* \(dtype differ\)"):
        trace_time.resume(out, facts_of(), plan, facts_of(model="large", dtype="float32"))
    trace_time.save(out, facts_of(), plan, runs)
    with pytest.raises(ValueError, match="was timed without a verifier server"):
        trace_time.resume(out, facts_of(), plan, facts_of(model="large"))
