"""servers.processes.replicas and servers.clients.sessions: replicas behind the real
vllm-router, sticky sessions.

The replicas are stand-ins (tests/fake_replica.py, one process each) behind the real
vllm-router binary: what is checked is the router's routing, the launcher's records and the
session header our clients send, without a vLLM server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from mur.cli.servers import main
from mur.servers.clients import probes
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.errors import ServerError
from mur.servers.clients.sessions import (
    SESSION_HEADER,
    clean_session_id,
    current_session_id,
    new_session_id,
    session,
    session_headers,
)
from mur.servers.processes import launcher, replicas
from mur.servers.processes.profiles import Profile, get_profile

FAKE_REPLICA = Path(__file__).resolve().parents[1] / "fake_replica.py"


pytestmark = pytest.mark.usefixtures("mur_home")  # tests/unit/conftest.py


def free_ports(count: int) -> int:
    """A port p with p .. p+count-1 all free now."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            first = int(sock.getsockname()[1])
        if first + count > 65535:
            continue
        try:
            held = []
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return first
    raise RuntimeError("no run of free ports found")


def fake_command(member: Profile) -> list[str]:
    return [sys.executable, str(FAKE_REPLICA), str(member.port), member.served_model_name]


def sessions_of(server: launcher.RunningServer) -> list[str | None]:
    return httpx.get(f"{probes.root_url(server.base_url)}/sessions", timeout=5).json()


# ------------------------------------------------------------------------------ profiles


def test_cpu_replicas_split_cores_and_kv_cache() -> None:
    base = replace(
        get_profile("cpu-tiny"),
        env={**get_profile("cpu-tiny").env, "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
    )
    first, second = (replicas.replica_profile(base, i, 2, 9001 + i) for i in range(2))
    assert (first.name, first.port, first.base_url) == ("cpu-tiny-r1", 9001, first.base_url)
    assert (second.name, second.port) == ("cpu-tiny-r2", 9002)
    assert first.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert second.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert first.env["VLLM_CPU_KVCACHE_SPACE"] == second.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert first.served_model_name == base.served_model_name and first.args == base.args
    assert base.env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the base profile is untouched


def test_gpu_replicas_take_one_device_each() -> None:
    base = get_profile("qwen3-8b")
    devices = [replicas.replica_profile(base, i, 3, 8100 + i).env for i in range(3)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in devices] == ["0", "1", "2"]


def test_split_cpus() -> None:
    assert replicas.split_cpus("0-1", 2) == ["0", "1"]
    assert replicas.split_cpus("0-4", 2) == ["0-2", "3-4"]
    assert replicas.split_cpus("0-1,4,6-7", 3) == ["0-1", "4,6", "7"]
    with pytest.raises(ServerError, match="3 CPU replicas need at least 3 cores"):
        replicas.split_cpus("0-1", 3)
    with pytest.raises(ServerError, match="cannot read the CPU list"):
        replicas.split_cpus("zero", 1)


def test_router_command_runs_the_checked_package() -> None:
    argv = replicas.router_command(
        ["http://127.0.0.1:9001", "http://127.0.0.1:9002"], port=9000, metrics_port=9100
    )
    assert argv[:3] == [sys.executable, "-m", "vllm_router.launch_router"]
    assert argv[argv.index("--policy") + 1] == "consistent_hash"
    workers = argv.index("--worker-urls")
    assert argv[workers + 1 : workers + 3] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert argv[argv.index("--prometheus-port") + 1] == "9100"
    with pytest.raises(ServerError, match="unknown router policy 'sticky'"):
        replicas.router_command([], port=1, metrics_port=2, policy="sticky")


def test_the_metrics_port_is_never_the_routers_or_a_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel may offer the router's own port again before the router binds it (CI's
    router died on "Address already in use" so): the exporter's port skips those."""
    offered = iter([9000, 9002, 9001, 9100])
    monkeypatch.setattr(replicas, "free_port", lambda host="127.0.0.1": next(offered))
    argv = replicas.router_command(["http://127.0.0.1:9001", "http://127.0.0.1:9002"], port=9000)
    assert argv[argv.index("--prometheus-port") + 1] == "9100"
    monkeypatch.setattr(replicas, "free_port", lambda host="127.0.0.1": 9000)
    with pytest.raises(ServerError, match=r"no free port on 127\.0\.0\.1 .* \[9000\]"):
        replicas.router_command([], port=9000)


def test_installed_router_is_vllm_project_0_1_17(monkeypatch: pytest.MonkeyPatch) -> None:
    replicas.check_router_installed()
    monkeypatch.setattr(replicas.importlib.metadata, "version", lambda name: "0.1.3")
    with pytest.raises(ServerError, match=r"vllm-router 0\.1\.3 is installed.*0\.1\.17"):
        replicas.check_router_installed()


# ------------------------------------------------------------------------------ sessions


def test_session_header_only_inside_a_session() -> None:
    llm = make_chat_model("http://127.0.0.1:9/v1", "m")
    messages = [HumanMessage("q"), AIMessage("Step1:")]
    assert "extra_headers" not in llm._get_request_payload(messages)
    with session("run-1/math500/7/critic/mur/0.9/0") as sid:
        payload = llm._get_request_payload(messages)
        assert payload["extra_headers"] == {SESSION_HEADER: sid}
        assert sid == "run-1/math500/7/critic/mur/0.9/0"
    assert session_headers() == {} and current_session_id() is None


def test_session_ids_are_header_safe() -> None:
    assert clean_session_id(" a b\nc\u00e9 ") == "a_b_c_"
    assert len(clean_session_id("x" * 500)) == 200
    assert new_session_id("run", "q 1") == "run/q_1"
    assert len(new_session_id()) == 32
    with pytest.raises(ValueError, match="must not be empty"):
        clean_session_id("  ")


async def test_concurrent_sessions_do_not_mix() -> None:
    async def one(name: str) -> list[str | None]:
        with session(name):
            seen = [current_session_id()]
            await asyncio.sleep(0.01)
            seen.append(current_session_id())
            return seen

    results = await asyncio.gather(*(one(f"q{i}") for i in range(5)))
    assert results == [[f"q{i}", f"q{i}"] for i in range(5)]


def test_langgraph_thread_id_is_the_session_by_default() -> None:
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        seen: str | None

    def node(state: State) -> dict:
        return {"seen": current_session_id()}

    graph = StateGraph(State)
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    graph.add_edge("node", END)
    from langgraph.checkpoint.memory import InMemorySaver

    compiled = graph.compile(checkpointer=InMemorySaver())
    out = compiled.invoke({"seen": None}, {"configurable": {"thread_id": "thread-42"}})
    assert out["seen"] == "thread-42"


# ------------------------------------------------------------------- router over replicas


def test_router_keeps_each_session_on_one_replica_and_survives_a_dead_one(
    mur_home: Path,
) -> None:
    port = free_ports(3)
    base = replace(get_profile("cpu-tiny"), port=port)
    group = replicas.up_replicas(base, 2, progress=False, replica_command=fake_command)
    try:
        assert group.router.started and all(r.started for r in group.replicas)
        assert group.base_url == f"http://127.0.0.1:{port}/v1"
        listed = {s.profile: s for s in launcher.status()}
        assert set(listed) == {"cpu-tiny-router", "cpu-tiny-r1", "cpu-tiny-r2"}
        assert "policy consistent_hash" in listed["cpu-tiny-router"].detail
        record = json.loads((mur_home / "run" / "cpu-tiny-r2.json").read_text())
        assert record["port"] == port + 2

        llm = make_chat_model(group.base_url, max_tokens=8)
        questions = [f"run-a/q{i}" for i in range(12)]
        for _step in range(3):
            for sid in questions:
                with session(sid):
                    llm.invoke([HumanMessage("What is 2 + 2?")])
        served = [sessions_of(r) for r in group.replicas]
        assert all(served), f"consistent hashing used one replica only: {served}"
        assert set(served[0]).isdisjoint(served[1])  # no question on two replicas
        assert Counter(served[0] + served[1]) == Counter({sid: 3 for sid in questions})

        # A replica dies: the router takes it out, its questions move to the other one.
        dead, alive = group.replicas
        os.killpg(dead.pid, signal.SIGKILL)
        moved = [sid for sid in questions if sid in served[0]]
        for sid in moved:  # each answered (the client retries nothing) ...
            with session(sid):
                llm.invoke([HumanMessage("What is 2 + 2?")])
        # ... by the replica left, once each
        assert Counter(sessions_of(alive)) - Counter(served[1]) == Counter(moved)

        # `up` again restarts the dead replica and reuses the rest, router included.
        again = replicas.up_replicas(base, 2, progress=False, replica_command=fake_command)
        assert [r.started for r in again.replicas] == [True, False]
        assert not again.router.started and again.router.pid == group.router.pid
        with pytest.raises(ServerError, match=r"already runs on .* policy consistent_hash"):
            replicas.up_replicas(
                base, 2, policy="round_robin", progress=False, replica_command=fake_command
            )
    finally:
        stopped = dict(replicas.down_group("cpu-tiny"))
    assert stopped == {"cpu-tiny-router": True, "cpu-tiny-r1": True, "cpu-tiny-r2": True}
    assert launcher.status() == []


def test_a_single_server_on_the_router_port_is_not_taken_for_a_router(mur_home: Path) -> None:
    port = free_ports(3)
    base = replace(get_profile("cpu-tiny"), port=port)
    single = launcher.up(base, progress=False, timeout=30, command=fake_command(base))
    try:
        with pytest.raises(ServerError, match=f"port {port} already serves something"):
            replicas.up_replicas(base, 2, progress=False, replica_command=fake_command)
        assert [s.profile for s in launcher.status()] == ["cpu-tiny"]
    finally:
        launcher.down(single.profile)


def test_a_replica_failing_to_start_stops_the_others(mur_home: Path) -> None:
    port = free_ports(3)
    base = replace(get_profile("cpu-tiny"), port=port)

    def second_fails(member: Profile) -> list[str]:
        if member.name.endswith("-r2"):
            return [sys.executable, "-c", "raise SystemExit('no GPU here')"]
        return fake_command(member)

    with pytest.raises(ServerError, match="cpu-tiny-r2 server exited while starting"):
        replicas.up_replicas(base, 2, progress=False, replica_command=second_fails)
    assert launcher.status() == []


def test_cli_replicas_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--policy", "round_robin"]) == 1
    assert "--policy is the router's: it needs --replicas N" in capsys.readouterr().err
    assert main(["up", "--replicas", "0"]) == 1
    assert "--replicas must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["up", "--replicas", "2", "--policy", "sticky"])
    assert info.value.code == 2


def test_a_url_list_is_refused_with_a_pointer_to_the_router() -> None:
    from mur.servers.connect import connect

    with pytest.raises(ServerError, match=r"--base-url takes one URL.*--replicas N"):
        connect(base_url="http://a:1/v1,http://b:2/v1", model="m", probe=False, env={})
    with pytest.raises(ServerError, match="MUR_BASE_URL takes one URL"):
        connect(model="m", probe=False, env={"MUR_BASE_URL": "http://a:1,http://b:2"})
    with pytest.raises(ServerError, match="--verifier-url takes one URL"):
        connect(base_url="http://a:1/v1", model="m", verifier_url="x:1,y:2", probe=False, env={})
