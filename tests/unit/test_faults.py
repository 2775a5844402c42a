"""Server faults against the real client code: what is retried, what stops, what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faulty_server import MODEL, faulty_server
from graphs import Context, build_graph
from nodes.llm import MissingLogprobsError
from servers import ServerUnavailable, check_endpoint, make_chat_model

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = Context(gate="never", max_steps=2)


def graph_for(base_url: str, timeout: float = 10.0):
    # The client's own retries are off so each attempt below is one of the graph's.
    model = make_chat_model(base_url, MODEL, max_retries=0, timeout=timeout)
    return build_graph("critic", backbone=model)


async def solve(base_url: str, timeout: float = 10.0) -> dict:
    return await graph_for(base_url, timeout).ainvoke({"question": "2 + 2?"}, context=CONTEXT)


async def test_transient_500s_are_retried() -> None:
    with faulty_server(["500", "500", "ok"]) as server:
        result = await solve(server.base_url)
    assert result["answer"] == "4"
    assert server.requests == 3


async def test_persistent_500s_stop_after_bounded_attempts() -> None:
    import openai

    with (
        faulty_server(["500"]) as server,
        pytest.raises(openai.InternalServerError, match="injected 500"),
    ):
        await solve(server.base_url)
    assert server.requests == 3


async def test_a_cut_body_is_retried() -> None:
    with faulty_server(["cut", "ok"]) as server:
        result = await solve(server.base_url)
    assert result["answer"] == "4" and server.requests == 2


async def test_a_timeout_is_retried() -> None:
    with faulty_server(["delay:3", "ok"]) as server:
        result = await solve(server.base_url, timeout=1.0)
    assert result["answer"] == "4" and server.requests == 2


async def test_missing_logprobs_fail_at_once_with_what_to_do() -> None:
    with (
        faulty_server(["no_logprobs"]) as server,
        pytest.raises(MissingLogprobsError, match="logprobs=true"),
    ):
        await solve(server.base_url)
    assert server.requests == 1


async def test_bad_requests_are_not_retried() -> None:
    import openai

    with faulty_server(["400"]) as server, pytest.raises(openai.BadRequestError):
        await solve(server.base_url)
    assert server.requests == 1


async def test_a_body_that_is_not_json_is_an_error() -> None:
    with faulty_server(["garbage"]) as server, pytest.raises(Exception) as info:
        await solve(server.base_url)
    assert not isinstance(info.value, AssertionError)


def test_refused_connection_names_the_url_and_the_fix() -> None:
    with pytest.raises(ServerUnavailable, match=r"127\.0\.0\.1:9.*python -m servers up"):
        check_endpoint("http://127.0.0.1:9/v1", timeout=2)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_cli_against_a_missing_server_says_so_in_one_line() -> None:
    done = run_cli("--strategy", "critic", "--base-url", "http://127.0.0.1:9/v1")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "http://127.0.0.1:9" in done.stderr and "python -m servers up" in done.stderr


def test_cli_reports_a_server_without_logprobs_in_one_line() -> None:
    with faulty_server(["no_logprobs"]) as server:
        done = run_cli("--strategy", "critic", "--gate", "never", "--base-url", server.base_url)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "logprobs" in done.stderr.strip().splitlines()[-1]


def test_cli_solves_against_any_openai_compatible_server() -> None:
    with faulty_server(["ok"]) as server:
        done = run_cli(
            "--strategy", "critic", "--gate", "never", "--json", "--base-url", server.base_url
        )
    assert done.returncode == 0, done.stderr
    assert '"answer": "4"' in done.stdout


def test_cli_sends_one_session_id_on_every_request_of_the_question() -> None:
    with faulty_server(["ok"]) as server:
        done = run_cli(
            "--strategy", "critic", "--gate", "always", "--json", "--base-url", server.base_url
        )
    assert done.returncode == 0, done.stderr
    assert len(server.sessions) >= 2  # a draft and its judge at least
    assert len(set(server.sessions)) == 1 and server.sessions[0].startswith("run.py/")
