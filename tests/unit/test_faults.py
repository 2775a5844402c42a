"""The README's fault table, row by row, through `run.py` with the shipped clients.

Every test runs the command line as a user would, against the loopback fault injector: the
client factory's own settings (no SDK retries, timeouts sized to max_tokens) and the graph's
RetryPolicy are what is tested, not a client built for the test. Timeouts are shortened only
through their documented environment variables.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from faulty_server import MODEL, STEP_TOKENS, faulty_server
from mur.servers.processes.profiles import DEFAULT_PROFILE

ROOT = Path(__file__).resolve().parents[2]
# A request may take 1 s + 1 ms per requested token before it counts as stalled: with
# --max-step-tokens 64 (FAST) a stalled attempt ends after about 1.06 s.
SHORT_TIMEOUTS = {"MUR_TIMEOUT_FLOOR_S": "1", "MUR_TIMEOUT_PER_TOKEN_S": "0.001"}
FAST = ("--max-step-tokens", "64")
ANSWER_REPLY_TOKENS = 13  # faulty_server's "ok": 12 tokens and the end of sequence


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MUR_")}
    return subprocess.run(
        [sys.executable, "run.py", "--strategy", "critic", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**environment, **(env or {})},
    )


def solve(base_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """run.py --json against `base_url`: (exit status, the output contract or {}, stderr)."""
    done = run_cli("--gate", "never", "--json", "--base-url", base_url, *args, env=env)
    result = json.loads(done.stdout) if done.returncode == 0 else {}
    return done.returncode, result, done.stderr


def one_line(stderr: str) -> str:
    """The last line of stderr, after checking that no traceback came before it."""
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------- no server at the URL


def test_no_server_at_base_url_names_it_and_what_to_do() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = run_cli("--base-url", url, "--model", "x")
    line = one_line(done.stderr)
    assert done.returncode == 1
    assert line.startswith(f"run.py: no vLLM server at {url}") and "--base-url" in line
    assert "mur servers" not in line  # the embedded server is not in use


def test_no_server_at_verifier_url_names_it() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with faulty_server(["ok"]) as server:
        done = run_cli("--base-url", server.base_url, "--verifier-url", url)
    line = one_line(done.stderr)
    assert done.returncode == 1
    assert f"no vLLM server at {url}" in line and "--verifier-url" in line
    assert server.requests == 0  # nothing was asked of the backbone


def test_no_server_at_mur_base_url_names_the_variable() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = run_cli(env={"MUR_BASE_URL": url})
    line = one_line(done.stderr)
    assert done.returncode == 1 and url in line and "MUR_BASE_URL" in line


# ----------------------------------------------------------------------- transient faults

TRANSIENT = ["500", "cut", "reset", "stall"]


@pytest.mark.parametrize("fault", TRANSIENT)
def test_a_transient_fault_is_retried_by_the_graph_alone(fault: str) -> None:
    with faulty_server([fault, fault, "ok"]) as server:
        status, result, stderr = solve(server.base_url, *FAST, env=SHORT_TIMEOUTS)
    assert status == 0, stderr
    assert result["answer"] == "4"
    # Two failed attempts and the good one: the client itself retried nothing.
    assert server.requests == 3
    assert result["usage"]["llm_calls"] == 1 and result["usage"]["failed_calls"] == 2


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("500", "failed the request (HTTP 500), 3 attempts: injected 500"),
        ("reset", "is unreachable (Connection error.), 3 attempts: is it still running there?"),
        ("stall", "did not answer in time, 3 attempts: is it stalled or overloaded?"),
    ],
)
def test_a_persistent_fault_stops_after_three_attempts(fault: str, says: str) -> None:
    with faulty_server([fault]) as server:
        status, _, stderr = solve(server.base_url, *FAST, env=SHORT_TIMEOUTS)
    assert status == 1
    assert f"the backbone at {server.base_url} {says}" in one_line(stderr)
    assert server.requests == 3


# ---------------------------------------------------------------------- permanent faults


def test_reply_without_logprobs_stops_at_once() -> None:
    with faulty_server(["no_logprobs"]) as server:
        status, _, stderr = solve(server.base_url)
    assert status == 1
    assert "logprobs" in one_line(stderr)
    assert server.requests == 1


def test_http_400_is_not_retried_and_says_so() -> None:
    with faulty_server(["400"]) as server:
        status, _, stderr = solve(server.base_url)
    assert status == 1
    said = one_line(stderr)
    assert (
        said
        == f"run.py: the backbone at {server.base_url} refused a request (HTTP 400): injected 400"
    )
    assert server.requests == 1


# -------------------------------------------------------------------------- the context


def test_context_overflow_ends_the_solution_with_what_was_kept() -> None:
    with faulty_server(["step", "overflow:5000"]) as server:
        status, result, stderr = solve(server.base_url)
    assert status == 0, stderr
    assert result["finish_reason"] == "context_length"
    assert [s["text"] for s in result["steps"]] == ["".join(STEP_TOKENS).strip()]
    assert result["answer"] == "4"  # the kept step's \boxed{4}
    assert result["fallback"] is None  # the prompt alone was too long: no room for one
    assert server.requests == 2 and result["usage"]["failed_calls"] == 1


def test_context_overflow_with_room_left_asks_for_the_answer_within_it() -> None:
    # The server says the prompt has 3900 of 4096 tokens: 196 left, 16 kept as a margin.
    with faulty_server(["step", "overflow:3900", "ok"]) as server:
        status, result, stderr = solve(server.base_url, "--max-step-tokens", "1024")
    assert status == 0, stderr
    assert result["finish_reason"] == "context_length"
    assert result["fallback"]["text"].endswith("the answer is 4.")
    assert server.bodies[2]["max_completion_tokens"] == 4096 - 3900 - 16
    assert len(result["steps"]) == 1 and server.requests == 3


def test_a_step_cut_by_the_end_of_the_context_ends_the_solution() -> None:
    with faulty_server(["length:5"]) as server:
        status, result, stderr = solve(server.base_url, "--max-step-tokens", "64")
    assert status == 0, stderr
    assert result["finish_reason"] == "context_length"
    assert len(result["steps"]) == 1 and server.requests == 1


def test_a_step_cut_by_its_own_cap_goes_on() -> None:
    with faulty_server(["length:8", "ok"]) as server:
        status, result, stderr = solve(server.base_url, "--max-step-tokens", "8")
    assert status == 0, stderr
    assert result["finish_reason"] == "answer" and len(result["steps"]) == 2


# ------------------------------------------------------------------------ usage and faults


def test_usage_counts_every_answered_attempt_against_the_servers_count() -> None:
    """A scaled step whose refine fails halfway: its critique counts, its failure too.

    Critic at step 1: draft, critique (answered), revise (500: the revise node alone is
    retried), revise; the revision states the answer.
    """
    with faulty_server(["step", "ok", "500", "ok"]) as server:
        done = run_cli("--gate", "always", "--json", "--base-url", server.base_url)
    assert done.returncode == 0, done.stderr
    usage = json.loads(done.stdout)["usage"]
    generated = usage["backbone_tokens"] + usage["external_tokens"]
    assert generated == server.completion_tokens
    assert usage["llm_calls"] == server.answered == 3
    assert usage["failed_calls"] == server.faults == 1
    assert usage["external_tokens"] == ANSWER_REPLY_TOKENS  # the one critique


# ----------------------------------------------------------------- resuming a single run


def test_checkpoint_and_thread_id_resume_from_the_command_line(tmp_path: Path) -> None:
    resume = ["--checkpoint", str(tmp_path / "run.sqlite"), "--thread-id", "t1"]
    with faulty_server(["step", "500"]) as server:
        status, _, stderr = solve(server.base_url, *resume)
    assert status == 1 and "HTTP 500" in one_line(stderr)
    assert server.requests == 1 + 3  # step 1 kept, step 2 failed three times
    with faulty_server(["ok"]) as server:
        status, result, stderr = solve(server.base_url, *resume)
    assert status == 0, stderr
    assert server.requests == 1  # only step 2 was asked again
    assert [s["index"] for s in result["steps"]] == [1, 2]
    assert result["answer"] == "4" and result["usage"]["llm_calls"] == 2
    with faulty_server(["ok"]) as server:  # a finished thread answers from the checkpoint
        status, again, _ = solve(server.base_url, *resume)
    assert status == 0 and again == result and server.requests == 0


def test_without_model_the_servers_own_is_asked_for() -> None:
    with faulty_server(["ok"]) as server:
        status, result, stderr = solve(server.base_url)
    assert status == 0, stderr
    assert result["answer"] == "4" and server.bodies[0]["model"] == MODEL


def test_cli_sends_one_session_id_on_every_request_of_the_question() -> None:
    with faulty_server(["ok"]) as server:
        done = run_cli("--gate", "always", "--json", "--base-url", server.base_url)
    assert done.returncode == 0, done.stderr
    assert len(server.sessions) >= 2  # a draft and its judge at least
    assert len(set(server.sessions)) == 1 and server.sessions[0].startswith("run.py/")


# ------------------------------------------------------ the embedded server dies while starting

# Stands in for vLLM's server module: 50 lines of start-up, then it fails.
DYING_VLLM = """import sys
for line in range(1, 51):
    print(f"vllm start-up line {line}", flush=True)
print("RuntimeError: cannot start (a stand-in for vLLM)", file=sys.stderr, flush=True)
sys.exit(3)
"""
# `python run.py ARGS` with the embedded profile moved to a free port (the real one may be in
# use) and PYTHONPATH in its server's environment, so that its `python -m
# vllm.entrypoints.openai.api_server` runs the stand-in. Nothing else of run.py is changed.
RUN_PY_WITH_DYING_SERVER = """import dataclasses, importlib, runpy, sys
profiles = importlib.import_module("mur.servers.processes.profiles")
port, fake_vllm, *args = sys.argv[1:]
known = profiles.profiles

def moved():
    table = known()
    default = table[profiles.DEFAULT_PROFILE]
    env = {**default.env, "PYTHONPATH": fake_vllm}
    table[default.name] = dataclasses.replace(default, model="m", port=int(port), env=env)
    return table

profiles.profiles = moved
sys.argv = ["run.py", *args]
runpy.run_path("run.py", run_name="__main__")
"""


def test_an_embedded_server_that_dies_while_starting_stops_run_py_with_its_log(
    tmp_path: Path,
) -> None:
    fake_vllm = tmp_path / "fake"
    module = fake_vllm / "vllm" / "entrypoints" / "openai"
    module.mkdir(parents=True)
    for package in (fake_vllm / "vllm", module.parent, module):
        (package / "__init__.py").write_text("")
    (module / "api_server.py").write_text(DYING_VLLM)
    home = tmp_path / "home"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MUR_")}
    argv = [str(free_port()), str(fake_vllm), "--strategy", "critic", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", RUN_PY_WITH_DYING_SERVER, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**environment, "MUR_HOME": str(home)},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    first, *tail = done.stderr.splitlines()
    log = home / "logs" / f"{DEFAULT_PROFILE}.log"
    assert first == (
        f"run.py: the {DEFAULT_PROFILE} server exited while starting with exit code 3. "
        f"Last lines of {log}:"
    )
    # The last 40 lines of its log, as the launcher promises.
    assert tail == [f"vllm start-up line {n}" for n in range(12, 51)] + [
        "RuntimeError: cannot start (a stand-in for vLLM)"
    ]
    assert not (home / "run" / f"{DEFAULT_PROFILE}.json").exists()  # no record of it is left
