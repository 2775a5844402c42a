"""Against the real vLLM CPU server (cpu-tiny): the client behaviour the graph relies on.

Also pins down vLLM facts the graph depends on: which tokens the logprobs list holds when a
stop string or EOS ends the text, and where `stop_reason` ends up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from mur.nodes.llm import Request, generate
from mur.servers.clients import probes
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.processes import launcher
from mur.servers.processes.launcher import RunningServer
from recorder import Recorder, read_both, recording_model

pytestmark = pytest.mark.integration

QUESTION = "What is 12 + 7? Answer step by step: Step1: ..., Step2: ..., then 'The answer is'."
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


def _tokens(msg: BaseMessage) -> list[str]:
    return [t["token"] for t in msg.response_metadata["logprobs"]["content"]]


def test_chat_completion_has_text_logprobs_and_usage(
    cpu_server: RunningServer, generated_tokens: Callable[[], int]
) -> None:
    llm = make_chat_model(cpu_server.base_url, max_tokens=48)
    msg = llm.invoke([HumanMessage(QUESTION)])
    assert isinstance(msg.content, str) and msg.content.strip()
    content = msg.response_metadata["logprobs"]["content"]
    assert content and all(isinstance(t["logprob"], float) for t in content)
    assert all(t["logprob"] <= 0.0 for t in content)
    usage = msg.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0
    assert usage["output_tokens"] == len(content)
    assert msg.response_metadata["finish_reason"] in ("stop", "length")
    assert "stop_reason" in msg.response_metadata
    assert msg.response_metadata["model_name"] == cpu_server.model
    # The server's own counter agrees with the client's usage (it may lag a moment).
    deadline = time.monotonic() + 5
    while generated_tokens() != usage["output_tokens"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert generated_tokens() == usage["output_tokens"]


def test_continue_partial_assistant_message(cpu_server: RunningServer) -> None:
    llm = make_chat_model(cpu_server.base_url, cpu_server.model, max_tokens=32, temperature=0.0)
    prefix = [HumanMessage(QUESTION), AIMessage("Step1:")]
    cont = llm.invoke(prefix, extra_body=CONTINUE)
    fresh = llm.invoke(prefix)
    assert isinstance(cont.content, str) and cont.content
    # A continuation goes on after "Step1:" (no restart of the step label, no new turn
    # markers); the same prompt without the flags answers a new turn instead.
    assert not cont.content.lstrip().startswith("Step1")
    assert "<|im_start|>" not in cont.content and "assistant" not in cont.content[:20]
    assert cont.content != fresh.content
    assert cont.usage_metadata and fresh.usage_metadata
    assert cont.usage_metadata["input_tokens"] < fresh.usage_metadata["input_tokens"]


def test_call_time_extra_body_keeps_top_k(cpu_server: RunningServer) -> None:
    """top_k=1 from the constructor survives a call-time extra_body: every sampled token is
    the most likely one (checked through top_logprobs; no penalty, so raw order = sampled).
    With stock ChatOpenAI (top_k dropped) the same call samples non-argmax tokens."""
    llm = make_chat_model(
        cpu_server.base_url,
        cpu_server.model,
        max_tokens=32,
        top_k=1,
        temperature=1.0,
        presence_penalty=0.0,
        top_logprobs=2,
    )
    msg = llm.invoke([HumanMessage(QUESTION), AIMessage("Step1:")], extra_body=CONTINUE)
    content = msg.response_metadata["logprobs"]["content"]
    assert content
    for entry in content:
        # vLLM lists the sampled token first when it is not the most likely one.
        best = max(t["logprob"] for t in entry["top_logprobs"])
        assert entry["logprob"] >= best - 1e-4, entry


def test_logprobs_include_stop_string_token_and_eos(cpu_server: RunningServer) -> None:
    """Stop strings are cut from the text but their token stays in logprobs; so does EOS."""
    llm = make_chat_model(cpu_server.base_url, cpu_server.model, max_tokens=64, stop=["\n"])
    seen_stop = seen_eos = False
    for seed in range(12):
        msg = llm.invoke([HumanMessage(QUESTION)], seed=seed)
        meta, toks = msg.response_metadata, _tokens(msg)
        assert msg.usage_metadata and msg.usage_metadata["output_tokens"] == len(toks)
        if meta["finish_reason"] == "stop" and meta["stop_reason"] == "\n":
            assert "\n" in toks[-1] and "\n" not in msg.content
            seen_stop = True
        elif meta["finish_reason"] == "stop" and meta["stop_reason"] is None:
            assert toks[-1] == "<|im_end|>" and "<|im_end|>" not in msg.content
            seen_eos = True
        if seen_stop and seen_eos:
            break
    assert seen_stop, "no sample ended on the stop string in 12 tries"
    # EOS before any newline is rarer; check it separately without the stop string.
    if not seen_eos:
        plain = make_chat_model(cpu_server.base_url, cpu_server.model, max_tokens=200)
        msg = plain.invoke([HumanMessage("Say hi.")])
        if msg.response_metadata["finish_reason"] == "stop":
            assert _tokens(msg)[-1] == "<|im_end|>"
            assert msg.response_metadata["stop_reason"] is None


def test_n_choices_keep_their_own_tokens_and_logprobs(cpu_server: RunningServer) -> None:
    """best_of_n and foresight read n candidates from one reply. Through the shipped client
    (LangChain's agenerate, as the graph calls it) each choice is the one the server sent:
    its tokens spell its own text, and choices with different texts have different logprobs."""
    recorder = Recorder()
    llm = recording_model(cpu_server.base_url, cpu_server.model, recorder, max_tokens=16, n=3)
    result = asyncio.run(llm.agenerate([[HumanMessage(QUESTION)]]))
    msgs = [g.message for g in result.generations[0]]
    (exchange,) = recorder.exchanges
    assert len(msgs) == len(exchange.choices) == 3
    entries = [msg.response_metadata["logprobs"]["content"] for msg in msgs]
    for msg, tokens, sent in zip(msgs, entries, exchange.choices, strict=True):
        assert msg.content == sent["message"]["content"]
        assert [(t["token"], t["logprob"]) for t in tokens] == [
            (t["token"], t["logprob"]) for t in sent["logprobs"]["content"]
        ]
        if msg.response_metadata["finish_reason"] == "stop":  # EOS: generated, not in the text
            assert tokens[-1]["token"] == "<|im_end|>"
            tokens = tokens[:-1]
        assert b"".join(bytes(t["bytes"]) for t in tokens).decode() == msg.content
    texts = [msg.content for msg in msgs]
    assert len(set(texts)) > 1, "three samples of 16 tokens came back identical"
    for i, j in itertools.combinations(range(3), 2):
        if texts[i] != texts[j]:
            assert [t["logprob"] for t in entries[i]] != [t["logprob"] for t in entries[j]]
    total = sum(len(tokens) for tokens in entries)
    # usage is per response: the first message carries the sum over all choices, the others
    # none (LangChain's meters add every choice's), and each names the served model.
    first, *others = msgs
    assert first.usage_metadata and first.usage_metadata["output_tokens"] == total
    assert all(m.usage_metadata is None for m in others)
    assert all(m.response_metadata["model_name"] == cpu_server.model for m in msgs)
    assert exchange.completion_tokens == total


def test_one_model_across_event_loops(cpu_server: RunningServer) -> None:
    llm = make_chat_model(cpu_server.base_url, cpu_server.model, max_tokens=4)
    for _ in range(2):
        msg = asyncio.run(llm.ainvoke([HumanMessage("Hi")]))
        assert msg.usage_metadata


def test_up_again_reuses_and_cli_reports(cpu_server: RunningServer) -> None:
    again = launcher.up("cpu-tiny", progress=False)
    assert again.started is False and again.healthy
    assert again.base_url == cpu_server.base_url and again.model == cpu_server.model
    assert probes.check_endpoint(cpu_server.base_url) == [cpu_server.model]
    out = subprocess.run(
        [sys.executable, "-m", "mur", "servers", "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    rows = json.loads(out)
    if cpu_server.pid is not None:  # recorded: started by us or a `mur servers up`
        row = next(r for r in rows if r["profile"] == "cpu-tiny")
        assert row["healthy"] is True and row["pid"] == cpu_server.pid
        assert {"profile", "base_url", "model", "pid", "healthy"} <= set(row)


@pytest.mark.parametrize("top", [0, 1, 20])
def test_the_lean_reader_reads_a_real_reply_as_the_stock_path(
    cpu_server: RunningServer, top: int
) -> None:
    """vLLM's own bytes (two choices, each ended by a stop string or EOS) read by the
    project's reader and by stock ChatOpenAI give the same choices, logprobs and usage."""
    recorder = Recorder()
    model = recording_model(cpu_server.base_url, cpu_server.model, recorder, max_tokens=24)
    request = Request(
        messages=[HumanMessage(QUESTION), AIMessage("Step1:")],
        max_tokens=24,
        stop=["\nStep"],
        n=2,
        top_logprobs=top or None,
    )
    recorded = asyncio.run(generate(model, request))
    (exchange,) = recorder.exchanges
    lean, stock, asked = read_both(exchange.raw, request, model=cpu_server.model)
    assert lean == stock == recorded
    assert asked[0] == asked[1] == exchange.request
    assert all(len(tops) == top for choice in lean.choices for tops in choice.top_logprobs)
