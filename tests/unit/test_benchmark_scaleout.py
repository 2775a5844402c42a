"""benchmarks.scaleout: the numbers it reports come from the servers' counters as stated, and
its load runs through the benchmark runner (here on a scripted model: no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes import FakeLogprobChat, Scripted
from mur.benchmarks.scaleout import ONE, Phase, fill_from_counters, run_load, table
from mur.cli.bench.scaleout import build_parser, main
from mur.evals.harness.records import load_records
from mur.evals.questions import load_dataset
from mur.servers.clients.metrics import (
    GENERATION_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    REQUESTS_DONE,
)


def snapshot(generated: float, queried: float, hits: float, done: float) -> dict[str, float]:
    return {
        GENERATION_TOKENS: generated,
        PREFIX_CACHE_QUERIES: queried,
        PREFIX_CACHE_HITS: hits,
        REQUESTS_DONE: done,
    }


def test_hit_rate_and_requests_are_deltas_summed_over_replicas() -> None:
    phase = Phase("consistent_hash", "0 + 1", wall_s=10.0, finished=4, graph_tokens=500)
    before = [snapshot(100, 1000, 100, 5), snapshot(0, 0, 0, 0)]
    after = [snapshot(400, 3000, 1600, 25), snapshot(200, 1000, 500, 12)]
    fill_from_counters(phase, before, after)
    assert phase.server_tokens == 500
    assert (phase.queried_tokens, phase.cached_tokens) == (3000, 2000)
    assert phase.hit_rate == pytest.approx(2000 / 3000)
    assert phase.requests == [20, 12] and phase.tokens_per_s == 50.0


def test_table_states_the_ratios() -> None:
    one = Phase(ONE, "0-1", wall_s=10, finished=4, graph_tokens=400)
    one.queried_tokens, one.cached_tokens = 1000, 700
    sticky = Phase("consistent_hash", "0 + 1", wall_s=20, finished=4, graph_tokens=400)
    sticky.queried_tokens, sticky.cached_tokens = 1000, 600
    spread = Phase("round_robin", "0 + 1", wall_s=25, finished=4, graph_tokens=400)
    spread.queried_tokens, spread.cached_tokens = 1000, 300
    text = table([one, sticky, spread])
    assert "| 2 replicas, consistent_hash + session header | 0 + 1 | 4 |" in text
    assert "| 60.0% | 600 / 1,000 |" in text
    assert "Hit rate consistent_hash / round_robin: **2.00x** (60.0% vs 30.0%)" in text
    assert "Throughput consistent_hash / one server: 0.50x tok/s." in text


def test_unknown_policy_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policies", "consistent_hash,sticky"]) == 2
    assert "policies must be among" in capsys.readouterr().err


def test_dry_run_plans_the_load_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dry-run", "--questions", "3", "--gate", "mur+bc", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 runs per configuration (3 MATH-500 questions, strategy critic")
    assert "'gate': 'mur', 'gamma': 0.9" in out and "'bias_correction': True" in out
    assert "'max_steps': 6" in out
    assert "- one server\n- 2 replicas, consistent_hash + session header\n" in out
    assert not any(tmp_path.iterdir())  # no server record, no run folder


def test_a_bad_strategy_or_gate_label_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--dry-run", "--strategy", "beam"]) == 2
    assert capsys.readouterr().err.startswith("mur bench scaleout: unknown strategy 'beam'")
    assert main(["--dry-run", "--gate", "mur@0.5"]) == 2
    assert "gate label 'mur@0.5'" in capsys.readouterr().err


def test_the_load_runs_through_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_load as a measurement runs it, on a scripted model in place of the servers: the path
    that an earlier refactor of the runner broke (it imported a function gone since)."""

    def respond(messages, kwargs) -> Scripted:
        if "You are a teacher" in str(messages[0].content):
            return Scripted("\\boxed{Yes}", [-0.1] * 3, stop_reason=None)
        return Scripted(" So the answer is 5.", [-0.5] * 6, stop_reason=None)

    monkeypatch.setattr(
        "mur.benchmarks.scaleout.make_chat_model", lambda url: FakeLogprobChat(responder=respond)
    )
    args = build_parser().parse_args(["--questions", "2", "--concurrency", "2"])
    args.home = tmp_path
    problems = load_dataset("math500", limit=2)
    phase = Phase(ONE, "0-1")
    run_load("http://127.0.0.1:9/v1", problems, args, phase)
    records = load_records(tmp_path / "runs" / ONE)
    assert (phase.finished, phase.failed, phase.errors) == (2, 0, [])
    assert {(r["gate"], r["gamma"]) for r in records} == {("mur", 0.9)}
    assert phase.graph_tokens == sum(r["usage"]["backbone_tokens"] for r in records) > 0
