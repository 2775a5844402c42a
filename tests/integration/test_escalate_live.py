"""Escalation across two real servers: `mur solve --strategy escalate` with SmolLM2 (cpu-tiny)
writing and the tiny random-weight Qwen3 as the external model rewriting every step, the
momentum reading the backbone's prompt logprobs of each kept text. The usage equals each
server's own generated-token counter, and the printed steps say which model wrote them."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from server_counters import settled

from mur.servers import generation_tokens
from mur.servers.processes.launcher import RunningServer
from tiny_qwen3 import TinyQwen3Server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "If 2x + 3 = 11, what is x?"


def mur_solve(cpu_server: RunningServer, external: TinyQwen3Server, *flags: str) -> str:
    command = [
        *(sys.executable, "-m", "mur", "solve", "--strategy", "escalate", "--gate", "always"),
        *("--question", QUESTION, "--max-steps", "3", "--max-step-tokens", "16"),
        *("--base-url", cpu_server.base_url, "--model", cpu_server.model),
        *("--verifier-url", external.base_url, "--verifier-model", external.model),
        *flags,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_escalation_counts_each_servers_tokens_and_rescores_the_kept_text(
    cpu_server: RunningServer, tiny_qwen3: TinyQwen3Server
) -> None:
    def counters() -> list[int]:
        return [settled(partial(generation_tokens, s.base_url)) for s in (cpu_server, tiny_qwen3)]

    before = counters()
    output = json.loads(
        mur_solve(cpu_server, tiny_qwen3, "--escalate-momentum", "rescored", "--json")
    )
    after = counters()
    usage = output["usage"]
    assert usage["backbone_tokens"] == after[0] - before[0]
    assert usage["external_tokens"] == after[1] - before[1]
    steps = [s for s in output["steps"] if s["scaled"]]
    assert steps and all(s["strategy"] == "escalate" for s in output["steps"])
    for step in steps:
        refine = step["refine"]
        assert refine["momentum_reads"] == "rescored"
        if refine["rewrite"]["text"]:  # the external model's text, kept
            assert step["text"] == refine["rewrite"]["text"]
            assert step["num_tokens"] == refine["rewrite"]["num_tokens"]
    # Each step a draft and a rewrite, one scoring request per rewritten text; a draft with
    # no token ends the solution unscored; the answer request after max_steps.
    rescored = sum(1 for s in steps if s["refine"]["rewrite"]["text"])
    drafts = len(steps) + (output["finish_reason"] == "empty_step")
    fallback = output["fallback"] is not None
    assert usage["llm_calls"] == drafts + len(steps) + rescored + fallback


def test_the_printed_steps_say_the_external_model_wrote_them(
    cpu_server: RunningServer, tiny_qwen3: TinyQwen3Server
) -> None:
    printed = mur_solve(cpu_server, tiny_qwen3, "--max-steps", "1")
    assert "SCALED (escalate: written by the external model" in printed


def test_trace_time_times_the_cascade_arms_by_both_servers_counts(
    cpu_server: RunningServer, tiny_qwen3: TinyQwen3Server, tmp_path: Path
) -> None:
    """`mur bench trace_time --arms cascade-...` on one question: the small model alone, the
    external model writing alone and every step escalated, each run's tokens equal to what the
    two servers' counters moved by together; the external model's server recorded beside."""
    out = tmp_path / "cascade-time.json"
    arms = ["cascade-small", "cascade-large", "cascade-always"]
    command = [
        *(sys.executable, "-m", "mur", "bench", "trace_time", "--limit", "1"),
        *("--arms", ",".join(arms), "--profile", "cpu-tiny"),
        *("--base-url", cpu_server.base_url, "--model", cpu_server.model),
        *("--verifier-url", tiny_qwen3.base_url, "--verifier-model", tiny_qwen3.model),
        *("--max-steps", "2", "--max-step-tokens", "8", "--out", str(out)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert all(f"| {arm} | 1 |" in done.stdout for arm in arms)
    document = json.loads(out.read_text())
    assert [run["arm"] for run in document["runs"]] == arms
    assert all(run["tokens"] == run["server_tokens"] > 0 for run in document["runs"])
    assert document["server"]["model"] == cpu_server.model
    assert document["verifier"]["model"] == tiny_qwen3.model
