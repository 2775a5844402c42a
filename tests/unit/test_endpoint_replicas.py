"""Replicas on one PostgreSQL, for real: `mur endpoint` processes over the scripted model server
(tests/faulty_server.py, "slowstep:S:N": N calls of S seconds, the answer at step N, whichever
replica asks) and the tests' PostgreSQL (the `postgres` fixture). A replica is SIGKILLed
mid-run and the client's retry with the same key finishes on the other one; PostgreSQL stops
mid-run and requests get 503 naming it until it is back; `mur endpoint --replicas 2` puts
vllm-router in front, a streamed run whose replica is killed is finished through it, and a
keyless one is run afresh on the other replica by the router's own retry.

The backbone's own request log says what was computed: one run's calls, plus at most the one
that was in flight when its replica died.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest

from faulty_server import ANSWER_TOKENS, MODEL, STEP_TOKENS, FaultyServer, faulty_server, step_of
from mur.cli.endpoint import PROG, build_parser, main
from mur.endpoint.idempotency import fingerprint
from mur.endpoint.replicas import replica_argv, router_argv
from mur.endpoint.schemas import ChatCompletionRequest, parse_job
from postgres import PASSWORD, PostgresServer, free_port
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6  # calls in one run: steps 1-5 without the answer, step 6 with it
SCRIPT = [f"slowstep:1:{STEPS}"]
STEP_USAGE, ANSWER_USAGE = len(STEP_TOKENS) + 1, len(ANSWER_TOKENS) + 1  # + the end token
BODY = {"model": "mur-critic-never", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
RETRYABLE = {409, 429, 502, 503}


@pytest.fixture
def pg_url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    return postgres.create_database(re.sub(r"\W", "_", request.node.name.lower())[:50])


def healthy(root: str) -> bool:
    try:
        return httpx.get(f"{root}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def endpoints(
    flags: list[list[str]], checkpointer: str, log: Path
) -> Iterator[list[tuple[str, subprocess.Popen[str]]]]:
    """`python -m mur endpoint FLAGS` for each entry, started at once, the checkpointer URL in
    the environment; their root URLs (the first port each listens on) and processes."""
    started = []
    with open(log, "a") as out:
        for argv in flags:
            port = free_port()
            command = [sys.executable, "-m", "mur", "endpoint", "--port", str(port), *argv]
            env = {**os.environ, "MUR_CHECKPOINTER": checkpointer}
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
            )
            started.append((f"http://127.0.0.1:{port}", process))
    try:
        for root, process in started:
            up = wait_until(lambda r=root, p=process: p.poll() is not None or healthy(r), 90)
            assert up and process.poll() is None, log.read_text()[-3000:]
        yield started
    finally:
        for _, process in started:
            if process.poll() is None:
                process.kill()
            process.wait(30)


def backbone_flags(server: FaultyServer) -> list[str]:
    return ["--base-url", server.base_url, "--model", MODEL, "--lease-seconds", "2"]


def ask(root: str, key: str | None, *, stream: bool = False, timeout: float = 60) -> httpx.Response:
    """One request (`key` None: without an Idempotency-Key); a stream (with its usage chunk)
    is read whole, its lines in `.text`."""
    body = {**BODY, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Idempotency-Key": key} if key is not None else {}
    with httpx.stream(
        "POST", f"{root}/v1/chat/completions", json=body, headers=headers, timeout=timeout
    ) as reply:
        reply.read()
    return reply


def in_thread(send: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    """Send in a thread of its own; what it got (a reply or the exception) lands in the list."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(send())
        except httpx.HTTPError as exc:
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def until_answered(root: str, key: str, *, stream: bool = False, timeout: float = 40) -> Any:
    """Retry `key` as a client should (honouring Retry-After) until it is answered 200; the
    reply and the statuses seen before it (0: no reply)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = ask(root, key, stream=stream)
        except httpx.HTTPError:
            seen.append(0)
            time.sleep(0.5)
            continue
        if reply.status_code == 200 and (not stream or "data: [DONE]" in reply.text):
            return reply, seen
        assert reply.status_code in RETRYABLE, reply.text
        seen.append(reply.status_code)
        time.sleep(float(reply.headers.get("retry-after", "1")))
    raise AssertionError(f"{key} was not answered in {timeout} s: {seen}")


def owner_pid(url: str) -> int:
    """The pid of the replica running the one run in the ledger (owner `host-pid`)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT owner FROM mur_runs WHERE status = 'running'").fetchone()
    assert row is not None
    return int(str(row[0]).rsplit("-", 1)[1])


def busy_replica_pid(router: str) -> int:
    """The pid of the replica behind `router` (its ports follow the router's) with a run in
    flight, by its /health and its command line: a keyless run is in no ledger."""
    port = int(router.rsplit(":", 1)[1])
    for replica in (port + 1, port + 2):
        if httpx.get(f"http://127.0.0.1:{replica}/health", timeout=2).json()["runs_in_flight"]:
            for process in psutil.process_iter(["cmdline"]):
                argv = process.info["cmdline"] or []
                if argv[1:3] == ["-m", "mur.cli.endpoint"] and f"{replica}" in argv:
                    return int(process.pid)
    raise AssertionError("no replica has a run in flight")


def check_computed_once(bodies: list[Any], reply: dict[str, Any], kept_before: int) -> None:
    """The backbone was asked for one run's steps plus the one in flight at the kill; the
    reply's usage counts what this request generated, usage_total each kept token once."""
    assert [step_of(body) for body in bodies] == [
        *range(1, kept_before + 2),
        *range(kept_before + 1, STEPS + 1),
    ]
    total = reply["mur"]["usage_total"]["completion_tokens"]
    assert total == (STEPS - 1) * STEP_USAGE + ANSWER_USAGE
    assert reply["usage"]["completion_tokens"] == total - kept_before * STEP_USAGE
    assert reply["mur"]["run"]["outcome"] == "resumed"


def test_a_replica_killed_mid_run_is_finished_by_another_with_the_same_key(
    pg_url: str, tmp_path: Path
) -> None:
    """SIGKILL during step 3 on replica A: the retry with the key gets 409 on B until A's
    2 s lease expires, then B resumes after step 2; only step 3 is computed twice."""
    with faulty_server(SCRIPT) as server:
        flags = backbone_flags(server)
        with endpoints([flags, flags], pg_url, tmp_path / "endpoints.log") as [(a, pa), (b, _)]:
            thread, got = in_thread(lambda: ask(a, "killed-mid-run"))
            assert wait_until(lambda: server.requests == 3, 30), "step 3 asked for"
            time.sleep(0.3)  # the call for step 3 is in flight
            pa.send_signal(signal.SIGKILL)
            thread.join(30)
            assert isinstance(got[0], httpx.HTTPError)  # the connection died with A
            reply, seen = until_answered(b, "killed-mid-run")
    assert set(seen) <= {409}, seen
    data = reply.json()
    assert data["choices"][0]["message"]["content"].count("Step") == STEPS
    check_computed_once(server.bodies, data, kept_before=2)


def test_postgres_stopping_mid_run_gives_503_naming_it_then_the_run_resumes(
    postgres: PostgresServer, pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL stops during step 2 (a fast shutdown): a new request and the run in flight
    get 503 naming the database (no traceback, no password); once it is back, a retry with
    the key resumes the run after its last checkpoint. The lease is 8 s here, not 2: a run
    stops itself when no renewal confirms its lease for 5/6 of one, and right after the
    restart the pool takes seconds to reconnect, which would stop the resumed run again."""
    shown = pg_url.replace(PASSWORD, "***")
    log = tmp_path / "endpoint.log"
    with (
        faulty_server(SCRIPT) as server,
        endpoints([[*backbone_flags(server), "--lease-seconds", "8"]], pg_url, log) as [(root, _)],
    ):
        thread, got = in_thread(lambda: ask(root, "through-an-outage"))
        assert wait_until(lambda: server.requests == 2, 30), "step 2 asked for"
        try:
            postgres.stop("fast")
            refused = ask(root, "while-it-is-down")
            thread.join(60)
        finally:
            postgres.start_again()
        for reply in (refused, got[0]):
            assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
            error = reply.json()["error"]
            assert error["code"] == "checkpointer_unavailable" and shown in error["message"]
        answered, _ = until_answered(root, "through-an-outage", timeout=45)
    data = answered.json()
    assert data["mur"]["run"]["outcome"] == "resumed"
    assert data["choices"][0]["message"]["content"].count("Step") == STEPS
    assert [step_of(body) for body in server.bodies][:2] == [1, 2]
    asked = [step_of(body) for body in server.bodies]
    assert len(asked) <= STEPS + 1, asked  # at most the step in flight asked again
    text = log.read_text()
    assert "Traceback" not in text and PASSWORD not in text


def test_the_router_carries_a_stream_and_a_keyless_run_past_killed_replicas(
    pg_url: str, tmp_path: Path
) -> None:
    """`mur endpoint --replicas 2` behind vllm-router, one supervisor for both cases.

    A streamed run loses its replica to SIGKILL during step 3: the client retries through the
    router with the same key and gets the whole stream (the kept steps first), and the
    supervisor restarts the replica. Then a keyless non-streamed run (nothing can resume it)
    loses its replica during step 3: the connection closes before any reply, the router
    retries the request on the other replica, which runs it from step 1; the client gets 200,
    a new run whose usage is that run's alone (steps 1-3 were computed twice, spent on the
    model server, in no reply). SIGTERM then stops it all with status 0."""
    log = tmp_path / "supervisor.log"
    with faulty_server(SCRIPT) as server:
        flags = ["--replicas", "2", "--log-level", "warning", *backbone_flags(server)]
        with endpoints([flags], pg_url, log) as [(router, supervisor)]:
            thread, got = in_thread(lambda: ask(router, "streamed", stream=True))
            assert wait_until(lambda: server.requests == 3, 30), "step 3 asked for"
            time.sleep(0.3)
            os.kill(owner_pid(pg_url), signal.SIGKILL)
            thread.join(30)
            assert not isinstance(got[0], httpx.Response) or "[DONE]" not in got[0].text
            reply, _ = until_answered(router, "streamed", stream=True)
            replay = ask(router, "streamed").json()
            restarted = wait_until(lambda: "answers again" in log.read_text(), 60)
            assert restarted, log.read_text()[-3000:]
            # The router takes the replica back after its own health checks (on a busy
            # machine the restart outlasts two of them and it marks the replica unhealthy):
            # killing the other one before that leaves no worker, a 503 by design.
            readmitted = wait_until(lambda: healthy(router), 60)
            assert readmitted, log.read_text()[-3000:]

            streamed_calls = server.requests
            thread, got = in_thread(lambda: ask(router, None))
            assert wait_until(lambda: server.requests == streamed_calls + 3, 30), "step 3"
            time.sleep(0.3)  # the call for step 3 is in flight
            os.kill(busy_replica_pid(router), signal.SIGKILL)
            thread.join(60)
            supervisor.send_signal(signal.SIGTERM)
            assert supervisor.wait(60) == 0, log.read_text()[-3000:]
    check_the_stream(server.bodies[:streamed_calls], reply, replay)
    assert "restarting it" in log.read_text()
    check_the_keyless_run(server.bodies[streamed_calls:], got[0])


def check_the_stream(bodies: list[Any], reply: httpx.Response, replay: dict[str, Any]) -> None:
    """The resumed stream sent steps 1-2 as restored, 3-6 afresh, each kept token counted
    once, and a replay with the key gets the same run."""
    chunks = [
        json.loads(line.removeprefix("data: "))
        for line in reply.text.splitlines()
        if line.startswith("data: {")
    ]
    steps = [chunk["mur_step"] for chunk in chunks if "mur_step" in chunk]
    assert [(s["index"], bool(s.get("restored"))) for s in steps] == [
        (1, True), (2, True), (3, False), (4, False), (5, False), (6, False)
    ]  # fmt: skip
    final = next(chunk for chunk in chunks if "mur" in chunk)
    check_computed_once(bodies, {"usage": chunks[-1]["usage"], "mur": final["mur"]}, 2)
    assert replay["mur"]["run"]["outcome"] == "replayed" and replay["id"] == final["id"]


def check_the_keyless_run(bodies: list[Any], reply: Any) -> None:
    """Steps 1-3 on the killed replica, then the whole run on the other; a new run with its
    own usage."""
    assert isinstance(reply, httpx.Response) and reply.status_code == 200, (reply, reply.text)
    data = reply.json()
    assert data["mur"]["run"] == {"outcome": "new", "idempotency_key": None}
    assert data["choices"][0]["message"]["content"].count("Step") == STEPS
    assert [step_of(body) for body in bodies] == [1, 2, 3, *range(1, STEPS + 1)]
    whole_run = (STEPS - 1) * STEP_USAGE + ANSWER_USAGE
    assert data["usage"]["completion_tokens"] == whole_run
    assert data["mur"]["usage_total"]["completion_tokens"] == whole_run


def test_replicas_need_a_postgres_checkpointer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "runs.sqlite"
    assert main(["--replicas", "2", "--checkpointer", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"{PROG}: error: --replicas 2 needs a PostgreSQL checkpointer the replicas share "
        "(--checkpointer postgresql://USER:PASSWORD@HOST:PORT/DB or MUR_CHECKPOINTER), got "
        f"{target}; see --help"
    )


def test_each_replica_gets_the_flags_given_but_its_own_port_and_secrets() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["--replicas", "3", "--port", "9000", "--host", "0.0.0.0", "--eager", "--api-key", "k1",
         "--api-key", "k2", "--max-runs", "8", "--checkpointer", "postgresql://u:pw@h/db",
         "--lease-seconds", "5"]
    )  # fmt: skip
    assert replica_argv(parser, args) == ["--eager", "--max-runs", "8", "--lease-seconds", "5.0"]
    router = router_argv([9001, 9002, 9003], "0.0.0.0", 9000)
    assert router[router.index("--worker-urls") + 1 : router.index("--policy")] == [
        "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"
    ]  # fmt: skip
    assert router[router.index("--policy") + 1] == "round_robin"
    assert router[router.index("--retry-max-retries") + 1] == "6"
    assert router[router.index("--cb-timeout-duration-secs") + 1] == "5"


def test_the_fields_vllm_router_adds_leave_the_fingerprint_alone() -> None:
    """The router re-serialises each body with SGLang's sampling fields (seen on the wire):
    a retry through it is the same request as the first one sent directly."""
    direct = {**BODY, "mur": {"gamma": 0.8}, "seed": 3}
    routed = {
        **direct,
        "stream": False,
        "logprobs": False,
        "no_stop_trim": False,
        "ignore_eos": False,
        "continue_final_message": False,
        "skip_special_tokens": True,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "return_hidden_states": False,
        "include_reasoning": True,
    }
    assert fingerprint(parse_job(ChatCompletionRequest.model_validate(routed))) == fingerprint(
        parse_job(ChatCompletionRequest.model_validate(direct))
    )
