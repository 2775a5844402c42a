"""The endpoint's edges: API key, run limit (429), body size (413), client disconnects, every
Context field accepted, and the command line. Real uvicorn, the scripted fake as backbone."""

from __future__ import annotations

import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from langchain_core.messages import BaseMessage
from pydantic import TypeAdapter, ValidationError

from asgi_server import running
from fakes import FakeLogprobChat, Scripted
from faulty_server import MODEL, faulty_server
from mur.cli import endpoint as endpoint_cli
from mur.cli.endpoint import build_parser, is_loopback, main
from mur.endpoint import MODELS, create_app, guards
from mur.endpoint.guards import ApiKey
from mur.graphs import Context
from mur.servers import connect as connect_module
from mur.servers.processes.launcher import RunningServer
from mur.servers.processes.profiles import DEFAULT_PROFILE, get_profile
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def endless(delay: float = 0.0, gate: threading.Event | None = None) -> FakeLogprobChat:
    """A backbone whose steps never state an answer; each call waits `delay` s (and `gate`)."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if gate is not None:
            gate.wait(timeout=30)
        time.sleep(delay)
        return Scripted(" one more step", [-0.5] * 4)

    return FakeLogprobChat(responder=respond)


def one_step() -> FakeLogprobChat:
    return FakeLogprobChat(
        responder=lambda m, k: Scripted(" So the answer is 42.", [-0.2] * 5, stop_reason=None)
    )


# ------------------------------------------------------------------------------- API key

KEY = "test-key-Zq9-do-not-log"


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    with running(create_app(one_step(), api_key=KEY)) as url:
        yield url


def test_api_key_is_required_on_v1_routes(keyed_url: str) -> None:
    for key in ("", "wrong-key", KEY + "x", KEY[:-1]):
        client = openai.OpenAI(base_url=keyed_url, api_key=key or "none", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            client.chat.completions.create(model="mur-critic", messages=QUESTION)
        assert caught.value.body["code"] == "invalid_api_key"
        assert KEY not in json.dumps(caught.value.body)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    bare = httpx.post(f"{keyed_url}/chat/completions", json={"model": "mur-critic"})
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    basic = httpx.get(f"{keyed_url}/models", headers={"Authorization": f"Basic {KEY}"})
    assert basic.status_code == 401
    client = openai.OpenAI(base_url=keyed_url, api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model="mur-critic", messages=QUESTION)
    assert reply.choices[0].message.content == "Step1: So the answer is 42.\n"
    assert len(client.models.list().data) == len(MODELS)


def test_health_is_open_but_shows_details_only_with_the_key(keyed_url: str) -> None:
    health = keyed_url.removesuffix("/v1") + "/health"
    assert httpx.get(health).json() == {"status": "ok"}
    detailed = httpx.get(health, headers={"Authorization": f"Bearer {KEY}"}).json()
    assert detailed["status"] == "ok" and detailed["runs_in_flight"] == 0


def test_api_key_keeps_only_a_digest() -> None:
    key = ApiKey(KEY)
    assert KEY not in repr(key) and KEY not in repr(vars(key))
    with pytest.raises(ValueError, match="empty"):
        ApiKey("  ")


def test_api_key_is_compared_in_constant_time(
    keyed_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request's key goes through hmac.compare_digest, on digests of one length whatever
    the key's, and its verdict alone decides: a `==` on the key (which stops at the first byte
    that differs) fails this."""
    real = hmac.compare_digest
    compared: list[tuple[int, int]] = []
    forced: bool | None = None

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b) if forced is None else forced

    monkeypatch.setattr(hmac, "compare_digest", spy)
    if hasattr(guards, "compare_digest"):  # imported by name
        monkeypatch.setattr(guards, "compare_digest", spy)

    def status(key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{keyed_url}/models", headers=headers).status_code

    assert [status(KEY), status("k"), status(KEY * 10)] == [200, 401, 401]
    assert len(compared) == 3 and len({*compared}) == 1 and compared[0][0] == compared[0][1]
    forced = False
    assert status(KEY) == 401
    forced = True
    assert status("wrong-key") == 200


# ------------------------------------------------------------------------- limits


def test_run_limit_answers_429_with_retry_after_and_frees_the_slot() -> None:
    gate = threading.Event()
    app = create_app(endless(gate=gate), max_runs=2, retry_after=1)
    with running(app) as url:
        body = {"model": "mur-critic-never", "messages": QUESTION, "mur": {"max_steps": 2}}
        results: list[int] = []

        def ask() -> None:
            results.append(httpx.post(f"{url}/chat/completions", json=body, timeout=30).status_code)

        holders = [threading.Thread(target=ask) for _ in range(2)]
        for thread in holders:
            thread.start()
        assert wait_until(lambda: app.state.service.in_flight == 2, 5)
        refused = httpx.post(f"{url}/chat/completions", json=body, timeout=5)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        # A client that honours Retry-After (the OpenAI SDK does) gets in once a slot frees.
        threading.Timer(0.3, gate.set).start()
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=3)
        reply = client.chat.completions.create(
            model=body["model"], messages=QUESTION, extra_body={"mur": body["mur"]}
        )
        assert reply.model_extra["mur"]["finish_reason"] == "max_steps"
        for thread in holders:
            thread.join(10)
        assert results == [200, 200]
        assert wait_until(lambda: app.state.service.in_flight == 0, 5)


def test_body_over_the_limit_is_413_with_or_without_content_length() -> None:
    with running(create_app(one_step(), max_request_bytes=2_000)) as url:
        big = {"model": "mur-critic", "messages": QUESTION, "padding": "x" * 3_000}
        declared = httpx.post(f"{url}/chat/completions", json=big)
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "request_too_large"

        def chunked() -> Iterator[bytes]:  # no Content-Length: the limit bites while reading
            text = json.dumps(big).encode()
            yield from (text[i : i + 500] for i in range(0, len(text), 500))

        streamed = httpx.post(
            f"{url}/chat/completions",
            content=chunked(),
            headers={"content-type": "application/json"},
        )
        assert streamed.status_code == 413 and "2,000 bytes" in streamed.json()["error"]["message"]
        small = httpx.post(f"{url}/chat/completions", json={**big, "padding": "x"})
        assert small.status_code == 200


def test_a_body_that_is_not_declared_json_is_415() -> None:
    with running(create_app(one_step())) as url:
        body = json.dumps({"model": "mur-critic", "messages": QUESTION})
        reply = httpx.post(f"{url}/chat/completions", content=body, headers={"content-type": ""})
        assert reply.status_code == 415 and "application/json" in reply.text


# -------------------------------------------------------------------- disconnects


def test_disconnect_mid_stream_cancels_the_run() -> None:
    """Without the cancel this run would go on for 40 steps x 0.15 s."""
    backbone = endless(delay=0.15)
    app = create_app(backbone)
    body = {"model": "mur-critic-never", "messages": QUESTION, "stream": True}
    body["mur"] = {"max_steps": 40}
    with running(app) as url, httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{url}/chat/completions", json=body) as reply:
            first = next(line for line in reply.iter_lines() if line.startswith("data: "))
            assert json.loads(first.removeprefix("data: "))["mur_step"]["index"] == 1
        # The connection is closed here, with the run in its second step.
        calls_at_disconnect = len(backbone.calls)
        assert wait_until(lambda: app.state.service.in_flight == 0, 2), "the run goes on"
        time.sleep(0.5)
        assert len(backbone.calls) <= calls_at_disconnect + 1  # at most the step in flight


def test_disconnect_while_waiting_for_a_whole_reply_cancels_the_run() -> None:
    backbone = endless(delay=0.15)
    app = create_app(backbone)
    body = {"model": "mur-critic-never", "messages": QUESTION, "mur": {"max_steps": 40}}
    with running(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json=body, timeout=0.5)
        calls_at_disconnect = len(backbone.calls)
        assert wait_until(lambda: app.state.service.in_flight == 0, 2), "the run goes on"
        time.sleep(0.5)
        assert len(backbone.calls) <= calls_at_disconnect + 1
        assert calls_at_disconnect < 40


# ------------------------------------------------------------------ Context fields

_CONTEXT = TypeAdapter(Context)


def other_value(name: str, default: Any, hint: Any) -> Any:
    """A valid value of setting `name` other than its default, where one can be derived."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        candidates = [a for a in args if a != default]
    elif isinstance(default, bool):
        candidates = [not default]
    elif isinstance(default, int):
        candidates = [default + 1]
    elif isinstance(default, float):
        candidates = [default / 2]
    elif default is None and int in args:
        candidates = [1000]
    elif default is None and float in args:
        candidates = [0.5]
    else:
        candidates = []
    for value in candidates:
        try:
            _CONTEXT.validate_python({name: value})
        except ValidationError:
            continue
        return value
    return default


def test_every_context_field_is_accepted_by_the_endpoint() -> None:
    defaults, hints = Context(), typing.get_type_hints(Context)
    client_calls: list[str] = []
    with running(create_app(one_step())) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        for name in Context.field_names():
            default = getattr(defaults, name)
            value = (
                default if name in ("strategy", "gate") else other_value(name, default, hints[name])
            )
            reply = client.chat.completions.create(
                model="mur-critic", messages=QUESTION, extra_body={"mur": {name: value}}
            )
            assert reply.model_extra["mur"]["config"][name] == value, name
            client_calls.append(name)
    assert client_calls == list(Context.field_names())


# ---------------------------------------------------------------------- command line


def test_cli_defaults_to_loopback_and_rejects_bad_flags(capsys: pytest.CaptureFixture) -> None:
    assert build_parser().parse_args([]).host == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    with pytest.raises(SystemExit) as caught:
        main(["--max-runs", "0"])
    assert caught.value.code == 2 and "--max-runs: must be > 0" in capsys.readouterr().err
    for port in ("99999", "-1", "0"):  # uvicorn would take 99999 modulo 65536
        for path in ([], ["--replicas", "2"]):
            with pytest.raises(SystemExit) as caught:
                main(["--port", port, *path, "--base-url", "http://127.0.0.1:9/v1"])
            assert caught.value.code == 2
            assert capsys.readouterr().err == (
                f"mur endpoint: error: argument --port: {port} is not a port number: give one "
                "from 1 to 65535; see --help\n"
            )
    assert main(["--model", "m"]) == 2  # refused before any server is probed
    assert (
        capsys.readouterr().err.strip()
        == "mur endpoint: error: --model needs --base-url; see --help"
    )
    assert main(["--base-url", "http://127.0.0.1:9/v1"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "http://127.0.0.1:9/v1" in err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_served_key_never_appears_in_the_logs() -> None:
    """`mur endpoint` with MUR_API_KEY at debug level: refused and accepted requests, a
    failing run (the backbone answers 400, logged), then shutdown; the key is nowhere in what
    it printed."""
    port = free_port()
    env = {**os.environ, "MUR_API_KEY": KEY}
    with faulty_server(["400"]) as backbone:
        command = [
            sys.executable,
            "-m",
            "mur",
            "endpoint",
            "--port",
            str(port),
            "--log-level",
            "debug",
        ]
        command += ["--base-url", backbone.base_url, "--model", MODEL]
        server = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            assert wait_until(lambda: _up(url), 60), "mur endpoint did not start"
            body = {"model": "mur-critic-never", "messages": QUESTION}
            assert httpx.post(url, json=body).status_code == 401
            wrong = {"Authorization": f"Bearer {KEY[::-1]}"}
            assert httpx.post(url, json=body, headers=wrong).status_code == 401
            right = {"Authorization": f"Bearer {KEY}"}
            failed = httpx.post(url, json=body, headers=right, timeout=60)
            assert failed.status_code == 502 and "HTTP 400" in failed.json()["error"]["message"]
        finally:
            server.terminate()
            output, _ = server.communicate(timeout=30)
    assert "API key required" in output and "run mur-critic-never failed" in output
    assert KEY not in output and KEY[::-1] not in output


def _up(url: str) -> bool:
    try:
        return httpx.get(url.split("/v1")[0] + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_endpoint_starts_the_embedded_server_when_none_is_given(monkeypatch) -> None:
    """As run.py: without --base-url or MUR_BASE_URL the endpoint starts (or reuses) the
    embedded CPU server rather than stopping with "no vLLM server"."""
    started: list[str] = []

    def up(profile, eager=False, progress=False):
        started.append(profile.name)
        return RunningServer(
            profile.name, profile.base_url, profile.served_model_name, 1, True, True, None
        )

    monkeypatch.delenv("MUR_BASE_URL", raising=False)
    monkeypatch.delenv("MUR_VERIFIER_URL", raising=False)
    monkeypatch.setattr(connect_module, "up", up)
    args = build_parser().parse_args(["--eager"])
    backbone, verifier, _, note = endpoint_cli.connect(args)
    assert started == [DEFAULT_PROFILE]
    assert backbone.openai_api_base == get_profile(DEFAULT_PROFILE).base_url
    assert verifier is backbone and note.startswith("embedded")
