"""A reply that is no chat completion, as proxies and other OpenAI-compatible servers send one
(docs/faults.md, issue 79): a gateway's HTML page, JSON cut short, no choices, a choice without
a message, logprobs that do not match the tokens, a body or a stream the connection cut, a
stream that ends before its last chunk.

Each is one line naming the server and what came back, the same words through `mur solve`,
ChatMUR (the project's error type, never a decoding error), the endpoint (502 naming the
upstream) and an evaluation run (the question's failure reason, the give-up rule). The graph
retries it like a 5xx: a gateway's page may pass; a server that always answers so does not.
Every case runs against the loopback fault injector (tests/faulty_server.py) with the shipped
clients.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import openai
import orjson
import pytest
from langchain_core.messages import HumanMessage

from asgi_server import running
from faulty_server import GATEWAY_PAGE, MODEL, faulty_server
from mur import ChatMUR
from mur.endpoint import create_app
from mur.evals.evaluation import run_evaluation
from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.records import RecordStore
from mur.evals.questions import load_dataset
from mur.graphs import Context, build_graph
from mur.graphs.model_calls import describe_failure
from mur.servers import ServerError, make_chat_model
from mur.servers.clients.chat_models import RequestTimeout
from mur.servers.clients.errors import BAD_REPLY_CHECK, CUT_REPLY_CHECK, BadReply
from mur.servers.clients.replies import reply_fault, undecodable
from mur.servers.clients.transport_errors import is_transient

ROOT = Path(__file__).resolve().parents[2]
TEST_DATA = ROOT / "tests" / "data"
NEVER = {"strategy": "critic", "gate": "never"}
# With --trace-stop confidence the second trace's steps are streamed (the first is the warm-up).
STREAMED = ("--traces", "2", "--trace-batch", "1", "--trace-stop", "confidence")
STREAMED_SETTINGS = {"traces": 2, "trace_batch": 1, "trace_stop": "confidence"}

# What each wrong reply's line says came back, and what it says to check.
SAYS = {
    "html": (
        f"answered HTTP 200 (text/html) with a body that is not JSON ({len(GATEWAY_PAGE)} "
        "bytes: '<html>\\r\\n<head><title>502 Bad Gateway</title>",
        BAD_REPLY_CHECK,
    ),
    "short_json": (
        "answered HTTP 200 (application/json) with JSON cut short after",
        BAD_REPLY_CHECK,
    ),
    "no_choices": (
        'answered HTTP 200 (application/json) with no choices ("choices": [])',
        BAD_REPLY_CHECK,
    ),
    "no_message": (
        "answered HTTP 200 (application/json) with choice 0 without a message",
        BAD_REPLY_CHECK,
    ),
    "miscount": (
        "answered HTTP 200 (application/json) with 12 token logprobs for 13 completion tokens",
        BAD_REPLY_CHECK,
    ),
    "cut": ("cut its reply short (the connection closed after", CUT_REPLY_CHECK),
}
WRONG_REPLIES = sorted(SAYS)
EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b")


def mur_solve(base_url: str, *args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MUR_")}
    return subprocess.run(
        [sys.executable, "-m", "mur", "solve", "--strategy", "critic", "--gate", "never",
         "--json", "--top-logprobs", "2", "--base-url", base_url, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip


def check_line(line: str, who: str, fault: str, attempts: str = ", 3 attempts: ") -> None:
    """`line` is `who`, what came back for `fault`, the attempts and what to check, without
    any Python exception's name."""
    what, check = SAYS[fault]
    assert line.startswith(f"{who} {what}"), line
    assert line.endswith(f"{attempts}{check}"), line
    assert EXCEPTION_NAME.search(line) is None, line
    assert "\n" not in line


# ------------------------------------------------------------------------------- mur solve


@pytest.mark.parametrize("fault", WRONG_REPLIES)
def test_mur_solve_names_the_server_and_what_came_back_after_three_attempts(fault: str) -> None:
    with faulty_server([fault]) as server:
        done = mur_solve(server.base_url)
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    check_line(line, f"mur solve: the backbone at {server.base_url}", fault)
    assert server.requests == server.faults == 3  # retried like a 5xx, then given up


def test_mur_solve_names_a_stream_that_ends_before_its_last_chunk() -> None:
    with faulty_server(["ok", "stream_cut"]) as server:
        done = mur_solve(server.base_url, *STREAMED)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        f"mur solve: the backbone at {server.base_url} ended a streamed reply after 7 chunks "
        f"without its last one (no finish_reason), 3 attempts: {BAD_REPLY_CHECK}"
    )
    assert [body.get("stream", False) for body in server.bodies] == [False, True, True, True]


@pytest.mark.parametrize("fault", [*WRONG_REPLIES, "stream_cut"])
async def test_a_wrong_reply_that_passes_costs_one_failed_call(fault: str) -> None:
    """A gateway's page once, then the server itself: the retry answers, the failed attempt
    is counted in failed_calls, and the tokens are the server's own count."""
    streamed = fault == "stream_cut"
    script = ["ok", fault, "ok"] if streamed else [fault, "ok"]
    settings = STREAMED_SETTINGS if streamed else {}
    with faulty_server(script) as server:
        graph = build_graph(backbone=make_chat_model(server.base_url, MODEL))
        context = Context(**NEVER, top_logprobs=2, **settings)
        output = await graph.ainvoke({"question": "What is 2 + 2?"}, context=context)
    assert output["answer"] == "4"
    usage = output["usage"]
    assert usage["failed_calls"] == server.faults == 1
    assert usage["llm_calls"] == server.answered
    assert usage["backbone_tokens"] == server.completion_tokens
    assert server.bodies[1].get("stream", False) is streamed


# ---------------------------------------------------------------------------------- ChatMUR


@pytest.mark.parametrize("fault", WRONG_REPLIES)
async def test_chat_mur_raises_the_projects_error_with_the_same_words(fault: str) -> None:
    with faulty_server([fault]) as server:
        llm = ChatMUR(base_url=server.base_url, **NEVER)
        with pytest.raises(ServerError) as caught:
            await llm.ainvoke("What is 2 + 2?")
    assert isinstance(caught.value, BadReply) and not isinstance(caught.value, ValueError)
    check_line(
        str(caught.value), f"the model server at {server.base_url}/chat/completions", fault, ": "
    )
    assert server.requests == 3


# --------------------------------------------------------------------------------- endpoint


@pytest.mark.parametrize("fault", WRONG_REPLIES)
def test_the_endpoint_answers_502_naming_the_upstream(fault: str) -> None:
    with faulty_server([fault]) as server:
        app = create_app(make_chat_model(server.base_url, MODEL))
        with running(app) as url:
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(
                    model="mur-critic-never", messages=[{"role": "user", "content": "2 + 2?"}]
                )
    assert caught.value.status_code == 502
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["code"]) == ("server_error", "upstream_error")
    check_line(error["message"], f"the backbone at {server.base_url}", fault)


# --------------------------------------------------------------------------- an evaluation


def evaluation(out: Path, *, questions: int, concurrency: int) -> EvaluationPlan:
    """The first `questions` of the test data, plain CoT, two steps at most."""
    return EvaluationPlan(
        dataset="math500",
        strategy="critic",
        problems=tuple(load_dataset("math500", TEST_DATA, limit=questions)),
        gates=("never",),
        settings={"max_steps": 2},
        out=out,
        concurrency=concurrency,
    )


def test_an_evaluation_records_the_reason_and_gives_up_on_a_server_that_always_answers_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = evaluation(tmp_path, questions=6, concurrency=1)
    with faulty_server(["html"]) as server:
        model = make_chat_model(server.base_url, MODEL)
        assert run_evaluation(plan, model, model) == 1
    # concurrency + 2 questions failed on the server in a row: the rest is left for a rerun.
    errors = [
        json.loads(line) for line in RecordStore(tmp_path).errors_path.read_text().splitlines()
    ]
    assert len(errors) == 3 and server.requests == 3 * 3
    who = f"the backbone at {server.base_url}"
    for error in errors:
        assert error["error"] == "BadReply"
        check_line(error["message"], who, "html")
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith(f"the model server stopped answering ({errors[0]['message']}); 0 runs")


def test_an_evaluation_whose_every_question_failed_says_so_without_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fewer questions than the give-up rule needs, all failed: no table of nothing."""
    plan = evaluation(tmp_path, questions=2, concurrency=2)
    with faulty_server(["no_choices"]) as server:
        model = make_chat_model(server.base_url, MODEL)
        assert run_evaluation(plan, model, model) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == (
        f"2 runs failed and none is recorded in {tmp_path} yet (reasons in "
        f"{tmp_path / 'errors.jsonl'}); rerun the same command to retry them"
    )
    assert not (tmp_path / "report.md").exists()


# ------------------------------------------------------------------------ the reply reader


async def test_the_client_heals_after_a_wrong_reply_as_after_a_reset() -> None:
    """A wrong reply may come from a gateway in front of a dead server: the embedded server's
    healer is awaited (it leaves a live server alone), then the error goes on to the retry."""
    healed = []

    async def heal() -> None:
        healed.append(1)

    with faulty_server(["html", "stream_cut"]) as server:
        model = make_chat_model(server.base_url, MODEL)
        model.on_failure = heal
        with pytest.raises(BadReply):
            await model.agenerate([[HumanMessage("hi")]])
        assert len(healed) == 1
        with pytest.raises(BadReply):
            async for _ in model.astream([HumanMessage("hi")]):
                pass
    assert len(healed) == 2


async def test_a_stream_cut_or_stalled_midway_is_named_so() -> None:
    """The connection closed mid-stream is a stream cut short, an event that is not JSON is
    named by its first bytes; a stream that stops sending is a server that did not answer in
    time, as a request that stalls is."""
    timeouts = RequestTimeout(floor_s=1.0, per_token_s=0.001)
    with faulty_server(["cut", "stream_html", "stream_stall"]) as server:
        model = make_chat_model(server.base_url, MODEL, max_tokens=8, timeouts=timeouts)
        with pytest.raises(BadReply) as cut:
            async for _ in model.astream([HumanMessage("hi")]):
                pass
        with pytest.raises(BadReply) as not_json:
            async for _ in model.astream([HumanMessage("hi")]):
                pass
        with pytest.raises(openai.APITimeoutError) as stalled:
            async for _ in model.astream([HumanMessage("hi")]):
                pass
    roles = {server.base_url: "backbone"}
    who = f"the backbone at {server.base_url}"
    assert re.fullmatch(
        rf"{re.escape(who)} cut a streamed reply short after \d+ chunks \(the connection "
        rf"closed after \d+ of its \d+ bytes\), 3 attempts: {re.escape(CUT_REPLY_CHECK)}",
        describe_failure(cut.value, roles),
    )
    assert describe_failure(not_json.value, roles) == (
        f"{who} sent a streamed chunk that is not JSON after 1 chunks (Expecting value: "
        f"'<html>'), 3 attempts: {BAD_REPLY_CHECK}"
    )
    assert describe_failure(stalled.value, roles).startswith(
        f"{who} did not answer in time, 3 attempts: is it stalled or overloaded?"
    )
    assert is_transient(cut.value) and is_transient(stalled.value)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "with an empty body"),
        (b'{"id": "x", "choices": [{"ind', "with JSON cut short after 29 bytes"),
        (
            b'{"id": "x"} trailing',
            "with a body that is not JSON (unexpected content after document at char 12; 20 "
            'bytes: \'{"id": "x"} trailing\')',
        ),
        (
            b'{"a": "\xff"}',
            "with a body that is not JSON (str is not valid UTF-8: surrogates not allowed at "
            'char 0; 10 bytes: \'{"a": "\ufffd"}\')',
        ),
        (b"x" * 100, f"with a body that is not JSON (100 bytes: '{'x' * 60}'...)"),
    ],
    ids=["empty", "cut short", "trailing text", "not UTF-8", "long"],
)
def test_a_body_that_does_not_decode_is_named_by_its_first_bytes(body: bytes, says: str) -> None:
    with pytest.raises(orjson.JSONDecodeError) as caught:
        orjson.loads(body)
    assert undecodable(body, caught.value) == says


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ([], "with JSON that is no chat completion (a JSON array)"),
        ({"id": "x"}, 'with no choices (no "choices" field)'),
        ({"choices": None}, 'with no choices ("choices": null)'),
        (
            {"error": {"message": "upstream timed out", "code": 504}},
            "with an error instead of choices: upstream timed out",
        ),
        (
            {"choices": [{"index": 0, "message": "hi"}]},
            'with choice 0 without a message ({"index": 0, "message": "hi"})',
        ),
        (
            {
                "choices": [{"message": {}, "logprobs": {"content": [{}, {}]}}] * 2,
                "usage": {"completion_tokens": 3},
            },
            "with 4 token logprobs for 3 completion tokens (usage.completion_tokens; one "
            "logprob per generated token was expected)",
        ),
        # Nothing to compare: no usage, or a choice without logprobs (nodes.llm's to say).
        ({"choices": [{"message": {}, "logprobs": {"content": [{}]}}]}, None),
        ({"choices": [{"message": {}, "logprobs": None}], "usage": {"completion_tokens": 3}}, None),
    ],
    ids=["array", "no field", "null", "error", "message not an object", "miscount", "no usage",
         "no logprobs"],
)  # fmt: skip
def test_a_reply_that_is_no_chat_completion_says_what_it_lacks(
    reply: object, says: str | None
) -> None:
    assert reply_fault(reply) == says


def test_every_wrong_reply_is_retried_like_a_5xx() -> None:
    assert is_transient(BadReply("http://h/v1/chat/completions", "answered HTTP 200 (text/html)"))
