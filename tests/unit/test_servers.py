"""Unit tests of servers/: profiles, launcher reuse/failure paths, client payloads, metrics.

No vLLM server is needed: a tiny HTTP server in a thread plays one where a test needs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from mur.cli.servers import main
from mur.servers.clients import chat_models, probes
from mur.servers.clients.chat_models import SAMPLING_DEFAULTS, make_chat_model
from mur.servers.clients.errors import ServerError, ServerStopped, ServerUnavailable
from mur.servers.clients.metrics import parse_counter
from mur.servers.connect import Healer
from mur.servers.processes import facts, launcher, pids
from mur.servers.processes.profiles import (
    CPU_DTYPE_ENV,
    EMBEDDED_MODEL,
    Profile,
    command_line,
    cpu_dtype,
    cpu_flags,
    cpu_list,
    get_profile,
    profiles,
    server_env,
)
from mur.servers.processes.replicas import free_port


@pytest.fixture(autouse=True)
def mur_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MUR_HOME: no records, logs or models leak between tests."""
    home = tmp_path / "mur-home"
    monkeypatch.setenv("MUR_HOME", str(home))
    for var in ("MUR_BASE_URL", "MUR_MODEL", "MUR_VERIFIER_URL", "MUR_VERIFIER_MODEL"):
        monkeypatch.delenv(var, raising=False)
    return home


class FakeVLLM:
    """Serves /health, /v1/models and /metrics like vLLM, on 127.0.0.1 in a thread."""

    def __init__(self, models: list[str], metrics: str = "") -> None:
        self.models, self.metrics = models, metrics
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, b"", "text/plain")
                elif self.path == "/v1/models":
                    body = {"object": "list", "data": [{"id": m} for m in fake.models]}
                    self._send(200, json.dumps(body).encode(), "application/json")
                elif self.path == "/metrics":
                    self._send(200, fake.metrics.encode(), "text/plain")
                else:
                    self._send(404, b"{}", "application/json")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                """Keep test output clean."""

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeVLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def tiny_on(port: int) -> Profile:
    return replace(get_profile("cpu-tiny"), port=port)


def serving(port: int) -> list[str]:
    """A process that answers every GET on `port` with cpu-tiny's model list, as vLLM's
    /health and /v1/models do: a server `launcher.up` can start, record and stop."""
    script = (
        "import http.server as h\n"
        "class H(h.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        '        body = b\'{"data": [{"id": "SmolLM2-135M-Instruct"}]}\'\n'
        "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers(); self.wfile.write(body)\n"
        f"h.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    return [sys.executable, "-c", script]


# ------------------------------------------------------------------------------- profiles


def test_profiles_cover_cpu_and_paper_models() -> None:
    ps = profiles()
    assert {"cpu-tiny", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "genprm-1.5b"} <= set(ps)
    tiny = ps["cpu-tiny"]
    assert tiny.model == EMBEDDED_MODEL and tiny.embedded and tiny.device == "cpu"
    assert tiny.package is not None and tiny.package.name == "SmolLM2-135M-Instruct"
    coder = ps["cpu-qwen-1.5b"]
    assert coder.package is not None and coder.served_model_name == coder.package.name
    assert coder.port == 8022 and ps["cpu-qwen-0.5b"].port == 8021
    assert "--dtype" in coder.args and ps["qwen3-8b"].package is None
    assert tiny.port == 8011 and tiny.base_url == "http://127.0.0.1:8011/v1"
    assert tiny.recommended == {
        "max_step_tokens": 256,
        "judge_max_tokens": 256,
        "thinking_budget": 256,
        "max_steps": 8,
    }
    assert ps["genprm-1.5b"].role == "verifier" and ps["genprm-1.5b"].port == 8001
    assert ps["genprm-1.5b"].model == "GenPRM/GenPRM-1.5B"
    for name in ("qwen3-1.7b", "qwen3-4b", "qwen3-8b"):
        assert ps[name].role == "backbone" and ps[name].port == 8000
    # Backbone and verifier must fit on one GPU together.
    util = {
        n: float(p.args[p.args.index("--gpu-memory-utilization") + 1])
        for n, p in ps.items()
        if p.device == "gpu"
    }
    assert util["qwen3-8b"] + util["genprm-1.5b"] < 0.95


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
        ({"avx2", "fma"}, "float32"),  # bf16 emulated: batching collapses (measured 3.8x slower)
        (set(), "float32"),
    ],
)
def test_cpu_dtype_follows_the_bf16_instructions(
    flags: set[str], dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MUR_CPU_DTYPE", raising=False)
    assert cpu_dtype(frozenset(flags)) == dtype
    monkeypatch.setenv("MUR_CPU_DTYPE", "float32")
    assert cpu_dtype(frozenset(flags)) == "float32"
    args = get_profile("cpu-tiny").args
    assert args[args.index("--dtype") + 1] == "float32"  # every CPU profile follows it
    monkeypatch.setenv("MUR_CPU_DTYPE", "fp8")
    with pytest.raises(ServerError, match="MUR_CPU_DTYPE='fp8'"):
        cpu_dtype(frozenset(flags))


def test_cpu_profiles_serve_bf16_weights_unless_a_format_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MUR_CPU_WEIGHTS", raising=False)
    assert get_profile("cpu-qwen-1.5b").weights == "bf16"  # int8 not adopted: prereg-int8.md
    assert command_line(get_profile("cpu-qwen-1.5b"), eager=False, python="py")[4].endswith(
        "/Qwen2.5-Coder-1.5B-Instruct"
    )
    monkeypatch.setenv("MUR_CPU_WEIGHTS", "w8a8")
    profile = get_profile("cpu-qwen-1.5b")
    assert profile.weights == "w8a8"
    assert command_line(profile, eager=False, python="py")[4].endswith("-Instruct-w8a8")
    monkeypatch.setenv("MUR_CPU_WEIGHTS", "int3")
    with pytest.raises(ServerError, match=r"MUR_CPU_WEIGHTS='int3'.*bf16, w8a8, w4a16"):
        get_profile("cpu-qwen-1.5b")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_cpu_tiny_env_binds_all_cores_and_stays_offline(mur_home: Path) -> None:
    env = get_profile("cpu-tiny").env
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_list()
    assert Path(env["VLLM_CACHE_ROOT"]).is_relative_to(mur_home)
    merged = server_env(get_profile("cpu-tiny"), {"PATH": "/bin", "HF_HUB_OFFLINE": "0"})
    assert merged["PATH"] == "/bin" and merged["HF_HUB_OFFLINE"] == "1"


def test_cpu_list_is_a_range_of_usable_cpus() -> None:
    text = cpu_list()
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus |= set(range(int(lo), int(hi or lo) + 1))
    assert cpus == set(__import__("os").sched_getaffinity(0))


def test_profile_is_immutable() -> None:
    tiny = get_profile("cpu-tiny")
    with pytest.raises(AttributeError):
        tiny.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        tiny.env["X"] = "1"  # type: ignore[index]


def test_unknown_profile_names_the_valid_ones() -> None:
    with pytest.raises(ServerError, match="cpu-tiny"):
        get_profile("nope")


def test_command_line_uses_module_entry_point(
    mur_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_DTYPE_ENV, "bfloat16")  # whatever this machine's CPU has
    tiny = get_profile("cpu-tiny")
    argv = command_line(tiny, eager=True, python="/py")
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == str(mur_home / "models" / "SmolLM2-135M-Instruct")
    assert argv[argv.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct"
    assert argv[argv.index("--port") + 1] == "8011"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    monkeypatch.setenv(CPU_DTYPE_ENV, "float32")
    plain = command_line(get_profile("cpu-tiny"), eager=True, python="/py")
    assert plain[plain.index("--dtype") + 1] == "float32"
    # Prefix-cache reuse (servers/processes/profiles.py).
    assert argv[argv.index("--block-size") + 1] == "32"
    assert argv[-1] == "--enforce-eager"
    assert "--enforce-eager" not in command_line(tiny, eager=False, python="/py")
    custom = command_line(tiny, eager=False, python="/py", model_path="/m")
    assert custom[custom.index("--model") + 1] == "/m"


def test_command_line_gpu_profile_passes_hf_id() -> None:
    argv = command_line(get_profile("genprm-1.5b"), eager=False, python="python")
    assert argv[argv.index("--model") + 1] == "GenPRM/GenPRM-1.5B"
    assert "--gpu-memory-utilization" in argv and argv[argv.index("--port") + 1] == "8001"


# --------------------------------------------------------------------------------- launcher


def test_check_endpoint_on_closed_port_says_what_to_do() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerUnavailable) as info:
        probes.check_endpoint(url, timeout=2)
    message = str(info.value)
    assert message == (
        f"no vLLM server at {url} ([Errno 111] Connection refused): start one with "
        "`mur servers up` or pass --base-url"
    )
    assert "\n" not in message


def test_check_endpoint_lists_models_and_normalizes_url() -> None:
    with FakeVLLM(["m1", "m2"]) as fake:
        assert probes.check_endpoint(fake.base_url) == ["m1", "m2"]
        assert probes.check_endpoint(f"http://127.0.0.1:{fake.port}") == ["m1", "m2"]


def test_normalize_and_root_url() -> None:
    assert probes.normalize_base_url("http://h:1") == "http://h:1/v1"
    assert probes.normalize_base_url("h:1/v1/") == "http://h:1/v1"
    assert probes.normalize_base_url("http://h:1/proxy/v1") == "http://h:1/proxy/v1"
    assert probes.root_url("http://h:1/v1") == "http://h:1"


def test_up_reuses_a_server_serving_the_expected_model() -> None:
    with FakeVLLM(["SmolLM2-135M-Instruct"]) as fake:
        server = launcher.up(
            tiny_on(fake.port), progress=False, command=["false"], model_path=Path("/x")
        )
    assert server.started is False and server.healthy is True
    assert server.base_url == fake.base_url and server.model == "SmolLM2-135M-Instruct"


def test_up_rejects_a_server_serving_another_model() -> None:
    with FakeVLLM(["some-other-model"]) as fake, pytest.raises(ServerError) as info:
        launcher.up(tiny_on(fake.port), progress=False, command=["false"], model_path=Path("/x"))
    message = str(info.value)
    assert "some-other-model" in message and "SmolLM2-135M-Instruct" in message
    assert str(fake.port) in message and "stop it" in message


def test_up_never_reuses_the_profiles_server_in_another_weight_format(
    mur_home: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "SmolLM2-135M-Instruct-w8a8"
    folder.mkdir()
    (folder / "mur-manifest.json").write_text(json.dumps({"weights": "w8a8"}))
    with FakeVLLM(["SmolLM2-135M-Instruct"]) as fake:
        profile = tiny_on(fake.port)
        pids.write_record(
            profile.name,
            {"pid": os.getpid(), "base_url": profile.base_url,
             "argv": ["python", "-m", "vllm", "--model", str(folder)]},
        )  # fmt: skip
        with pytest.raises(ServerError) as info:
            launcher.up(profile, progress=False, command=["false"], model_path=Path("/x"))
        message = str(info.value)
        assert "serves w8a8 weights, not bf16" in message and "\n" not in message
        assert f"mur servers down --profile {profile.name}" in message
        (folder / "mur-manifest.json").write_text(json.dumps({"weights": "bf16"}))
        server = launcher.up(profile, progress=False, command=["false"], model_path=Path("/x"))
    assert server.started is False and server.healthy is True


def test_up_rejects_a_port_held_by_something_else() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = int(sock.getsockname()[1])
        with pytest.raises(ServerError, match="in use"):
            launcher.up(tiny_on(port), progress=False, command=["false"], model_path=Path("/x"))


def test_process_dying_at_start_reports_log_tail(mur_home: Path) -> None:
    script = (
        "import sys; print('loading weights'); print('boom: bad flag', file=sys.stderr); "
        "sys.exit(3)"
    )
    with pytest.raises(ServerError) as info:
        launcher.up(
            tiny_on(free_port()),
            progress=False,
            timeout=30,
            command=[sys.executable, "-c", script],
        )
    message = str(info.value)
    assert "exited while starting with exit code 3" in message
    assert "boom: bad flag" in message and "loading weights" in message
    assert (mur_home / "logs" / "cpu-tiny.log").is_file()
    assert launcher.status() == []  # the record is gone


VLLM_START_FAILURE = (
    """\
(APIServer pid=100) INFO 11-27 09:30:55 [api_server.py:1] vLLM API server version 0.32.0
(EngineCore_DP0 pid=123) ERROR 11-27 09:31:02 [core.py:712] EngineCore failed to start.
(EngineCore_DP0 pid=123) ERROR 11-27 09:31:02 [core.py:712] Traceback (most recent call last):
(EngineCore_DP0 pid=123) ERROR 11-27 09:31:02 [core.py:712]   File "core.py", line 703, in run
(EngineCore_DP0 pid=123) ERROR 11-27 09:31:02 [core.py:712]     raise ValueError(msg)
(EngineCore_DP0 pid=123) ERROR 11-27 09:31:02 [core.py:712] ValueError: 3.50 GiB KV cache is \
needed, which is larger than the available KV cache memory (1.00 GiB)
"""
    + "".join(f"(APIServer pid=100) noise line {i}\n" for i in range(60))
    + """\
(APIServer pid=100) Traceback (most recent call last):
(APIServer pid=100)   File "api_server.py", line 9, in <module>
(APIServer pid=100) RuntimeError: Engine core initialization failed. See root cause above.
"""
)


def test_a_start_failure_names_the_root_cause_from_the_first_error_block(
    mur_home: Path,
) -> None:
    """vLLM's last lines are its API server's traceback ("See root cause above"): the message
    names the first error block's exception, which the log tail no longer holds."""
    script = f"import sys; sys.stdout.write({VLLM_START_FAILURE!r}); sys.exit(1)"
    with pytest.raises(ServerError) as info:
        launcher.up(
            tiny_on(free_port()), progress=False, timeout=30, command=[sys.executable, "-c", script]
        )
    message = str(info.value)
    first_line = message.splitlines()[0]
    assert first_line.startswith(
        "the cpu-tiny server exited while starting with exit code 1: EngineCore failed to "
        "start. ValueError: 3.50 GiB KV cache is needed"
    )
    tail = message.split("Last lines of", 1)[1]
    assert "See root cause above" in tail and "ValueError" not in tail  # cut from the tail
    assert launcher.log_root_cause(mur_home / "nowhere.log") is None


def test_timeout_kills_the_process_and_reports(mur_home: Path) -> None:
    script = "import time; print('still loading', flush=True); time.sleep(60)"
    before = set(pids.CHILDREN)  # a session server may be running in this process
    with pytest.raises(ServerError) as info:
        launcher.up(
            tiny_on(free_port()),
            progress=False,
            timeout=1.5,
            command=[sys.executable, "-u", "-c", script],
        )
    assert "not healthy after 1.5 s" in str(info.value) and "still loading" in str(info.value)
    assert launcher.status() == [] and set(pids.CHILDREN) == before


def test_start_record_status_and_down(
    mur_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake server process started by `up`: recorded, listed by status with the format its
    command line serves (the folder's manifest, the --dtype flag), reused by an `up` that
    asks for that format, stopped by down."""
    monkeypatch.setenv("MUR_CPU_WEIGHTS", "w8a8")
    port = free_port()
    folder = mur_home / "models" / "SmolLM2-135M-Instruct-w8a8"
    folder.mkdir(parents=True)
    (folder / "mur-manifest.json").write_text(json.dumps({"weights": "w8a8"}))
    command = [*serving(port), "--model", str(folder), "--dtype", "bfloat16"]
    server = launcher.up(tiny_on(port), progress=False, timeout=30, command=command)
    try:
        assert server.started and server.healthy and server.pid
        record = json.loads((mur_home / "run" / "cpu-tiny.json").read_text())
        assert record["pid"] == server.pid and record["port"] == port
        assert record["base_url"] == server.base_url and record["model"] == server.model
        listed = launcher.status()
        assert [(s.profile, s.pid, s.healthy, s.weights, s.dtype) for s in listed] == [
            ("cpu-tiny", server.pid, True, "w8a8", "bfloat16")
        ]
        assert main(["status"]) == 0
        assert "model=SmolLM2-135M-Instruct weights=w8a8 dtype=bfloat16 pid=" in (
            capsys.readouterr().out
        )
        again = launcher.up(tiny_on(port), progress=False, command=["false"])
        assert again.started is False and again.pid == server.pid
    finally:
        assert launcher.down("cpu-tiny") is True
    assert launcher.status() == [] and not (mur_home / "run" / "cpu-tiny.json").exists()
    assert launcher.down("cpu-tiny") is False


def test_a_server_stopped_with_down_is_not_started_again_by_a_runs_healer(
    mur_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mur servers down` while a run uses the embedded server: the run's next request fails,
    its Healer finds the stop mark and raises ServerStopped (one line: who stopped it, how to
    go on) instead of starting the server behind the person who stopped it. The next `up`
    lifts the stop."""
    port = free_port()
    profile = tiny_on(port)
    server = launcher.up(profile, progress=False, timeout=30, command=serving(port))
    client = make_chat_model(server.base_url, server.model, timeout=5)
    client.on_failure = Healer(profile, eager=True, say=lambda line: None).recover

    def start_nothing(*_: object, **__: object) -> None:
        pytest.fail("the Healer started a server that `mur servers down` stopped")

    assert main(["down", "--profile", "cpu-tiny"]) == 0
    assert pids.stopped_at("cpu-tiny") is not None
    with monkeypatch.context() as patch:
        patch.setattr(launcher, "ensure_model", start_nothing)
        patch.setattr(launcher, "_start", start_nothing)
        with pytest.raises(ServerStopped) as stopped:
            asyncio.run(client.ainvoke([HumanMessage("2+2?")]))
    said = str(stopped.value)
    assert f"the cpu-tiny server at {server.base_url} was stopped with `mur servers down`" in said
    assert "`mur servers up --profile cpu-tiny`" in said and "\n" not in said
    assert launcher.status() == []

    again = launcher.up(profile, progress=False, timeout=30, command=serving(port))
    try:
        assert again.started and pids.stopped_at("cpu-tiny") is None
    finally:
        launcher.down("cpu-tiny")


def test_records_guard_against_pid_reuse_and_zombies() -> None:
    me = os.getpid()
    record = {"pid": me, "create_time": pids.create_time(me)}
    assert pids.record_alive(record)
    # The same PID, started at another time: some other process now has that number.
    assert not pids.record_alive({**record, "create_time": record["create_time"] - 100})
    assert pids.record_alive({"pid": me, "start_ticks": 1})  # an older version's record
    assert pids.group_alive(os.getpgid(me))
    exited = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 60
    while pids.alive(exited.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # not reaped yet: a zombie, which counts as gone
    assert not pids.alive(exited.pid) and not pids.group_alive(exited.pid)
    assert exited.wait(timeout=5) == 0


def test_status_cleans_stale_records(mur_home: Path) -> None:
    run = mur_home / "run"
    run.mkdir(parents=True)
    (run / "cpu-tiny.json").write_text(
        json.dumps({"pid": 2**22 + 12345, "base_url": "http://127.0.0.1:1/v1", "model": "m"})
    )
    assert launcher.status() == []
    assert not (run / "cpu-tiny.json").exists()


def test_status_leaves_a_record_alone_while_up_holds_the_profile(mur_home: Path) -> None:
    """`up` holds the profile's lock while it starts a server and writes its record: status
    neither waits for it nor removes what is there (the next status does, if still dead)."""
    run = mur_home / "run"
    run.mkdir(parents=True)
    record = run / "cpu-tiny.json"
    record.write_text(json.dumps({"pid": 2**22 + 12345, "base_url": "http://x:1/v1"}))
    with launcher._profile_lock("cpu-tiny"):
        holder = threading.Thread(target=lambda: launcher.status())  # another process's status
        holder.start()
        holder.join(10)
        assert not holder.is_alive() and record.exists()
    assert launcher.status() == [] and not record.exists()


# ----------------------------------------------------------------------------------- CLI


def test_cli_status_json_empty(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_cli_server_error_is_one_message_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_: object, **__: object) -> None:
        raise ServerError("port 8011 is already taken by X: stop it")

    monkeypatch.setattr("mur.cli.servers.up", fail)
    assert main(["up"]) == 1
    err = capsys.readouterr().err
    assert err == "error: port 8011 is already taken by X: stop it\n"


def test_cli_bad_args_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["up", "--profile", "no-such-profile"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["down", "--all", "--profile", "cpu-tiny"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:  # checked before any server starts
        main(["up", "--port", "99999"])
    assert info.value.code == 2


# -------------------------------------------------------------------------------- clients


def _payload(llm: chat_models.VLLMChatOpenAI, **kwargs: object) -> dict:
    return llm._get_request_payload([HumanMessage("q"), AIMessage("Step1:")], **kwargs)


def test_make_chat_model_sends_every_sampling_parameter() -> None:
    llm = make_chat_model("http://127.0.0.1:9/v1", "m", max_tokens=64)
    payload = _payload(llm)
    assert payload["model"] == "m"
    assert payload["temperature"] == SAMPLING_DEFAULTS["temperature"] == 0.6
    assert payload["top_p"] == 0.8 and payload["presence_penalty"] == 1.5
    assert payload["extra_body"]["top_k"] == 20
    assert payload["logprobs"] is True
    assert payload["max_completion_tokens"] == 64
    assert str(llm.openai_api_base) == "http://127.0.0.1:9/v1"


def test_call_time_extra_body_is_merged_not_replaced() -> None:
    llm = make_chat_model("http://127.0.0.1:9", "m", extra_body={"repetition_penalty": 1.1})
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    payload = _payload(llm, extra_body=extra, stop=["\n\n"])
    assert payload["extra_body"] == {
        "top_k": 20,
        "repetition_penalty": 1.1,
        **extra,
    }
    assert payload["stop"] == ["\n\n"]
    bound = llm.bind(extra_body={"top_k": 5})
    merged = bound.bound._get_request_payload("q", **bound.kwargs)  # type: ignore[attr-defined]
    assert merged["extra_body"] == {"top_k": 5, "repetition_penalty": 1.1}
    assert llm.extra_body == {"top_k": 20, "repetition_penalty": 1.1}  # not mutated


def test_overrides_replace_defaults() -> None:
    llm = make_chat_model("http://h:1/v1", "m", temperature=0.0, top_k=1, n=4, top_logprobs=3)
    payload = _payload(llm)
    assert payload["temperature"] == 0.0 and payload["extra_body"]["top_k"] == 1
    assert payload["n"] == 4 and payload["top_logprobs"] == 3


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_chat_model("http://h:1", "m").openai_api_key.get_secret_value() == "EMPTY"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert make_chat_model("http://h:1", "m").openai_api_key.get_secret_value() == "sk-test"


def test_model_resolved_from_server() -> None:
    with FakeVLLM(["served-name"]) as fake:
        assert make_chat_model(fake.base_url).model_name == "served-name"


def test_model_resolution_without_server_raises_unavailable() -> None:
    with pytest.raises(ServerUnavailable, match="no vLLM server"):
        make_chat_model(f"http://127.0.0.1:{free_port()}/v1")


def test_each_choice_keeps_its_own_metadata_and_stop_reason() -> None:
    llm = make_chat_model("http://h:1/v1", "m")
    response = {
        "id": "x",
        "model": "m",
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": f"c{i}"},
                "finish_reason": reason,
                "stop_reason": stop,
                "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.5 * i}]},
            }
            for i, (reason, stop) in enumerate([("stop", "\n\n"), ("length", None)])
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    result = llm._create_chat_result(response)
    infos = [g.generation_info for g in result.generations]
    assert infos[0]["stop_reason"] == "\n\n" and infos[1]["stop_reason"] is None
    assert [i["finish_reason"] for i in infos] == ["stop", "length"]
    assert infos[0]["logprobs"]["content"][0]["token"] == "t0"
    assert infos[1]["logprobs"]["content"][0]["token"] == "t1"


# -------------------------------------------------------------------------------- metrics


METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="a"} 120.0
vllm:generation_tokens_total{engine="0",model_name="b"} 3.0
vllm:generation_tokens_total_created{engine="0",model_name="a"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="a"} 45.0
"""


def test_parse_counter_sums_label_sets_and_ignores_created() -> None:
    assert parse_counter(METRICS, "vllm:generation_tokens_total") == 123.0
    assert parse_counter(METRICS, "vllm:prompt_tokens_total") == 45.0
    assert parse_counter(METRICS, "vllm:missing") is None


def test_generation_tokens_over_http() -> None:
    from mur.servers.clients.metrics import generation_tokens, prompt_tokens

    with FakeVLLM(["m"], METRICS) as fake:
        assert generation_tokens(fake.base_url) == 123
        assert prompt_tokens(f"http://127.0.0.1:{fake.port}") == 45


def test_generation_tokens_without_server() -> None:
    from mur.servers.clients.metrics import generation_tokens

    with pytest.raises(ServerUnavailable, match="metrics"):
        generation_tokens(f"http://127.0.0.1:{free_port()}/v1")


def test_a_pair_starts_backbone_then_verifier_on_shared_or_split_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`mur servers up --profile A --verifier-profile B [--cores split]`: the backbone
    first (two compiles at once fight over the cores), each on the cores the way asks for."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    started: list[tuple[str, str, str]] = []

    def fake_up(profile, **_: object) -> launcher.RunningServer:
        env = profile.env
        started.append(
            (profile.name, env["VLLM_CPU_OMP_THREADS_BIND"], env["VLLM_CPU_KVCACHE_SPACE"])
        )
        return launcher.RunningServer(profile.name, profile.base_url, "m", 1, True, True, None)

    monkeypatch.setattr(launcher, "up", fake_up)
    launcher.up_pair("cpu-qwen-0.5b", "cpu-qwen-1.5b", cores="shared", progress=False)
    launcher.up_pair("cpu-qwen-0.5b", "cpu-qwen-1.5b", cores="split", progress=False)
    assert started == [  # KV caches sized for the pair (launcher.PAIR_KV_CACHE_GIB)
        ("cpu-qwen-0.5b", "0-1", "1"),
        ("cpu-qwen-1.5b", "0-1", "2"),
        ("cpu-qwen-0.5b", "0", "1"),
        ("cpu-qwen-1.5b", "1", "2"),
    ]
    with pytest.raises(ServerError, match="both use port 8021"):
        launcher.up_pair("cpu-qwen-0.5b", "cpu-qwen-0.5b", progress=False)


def test_cli_pair_refuses_one_port_for_two_servers(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["up", "--profile", "cpu-qwen-0.5b", "--verifier-profile", "cpu-qwen-1.5b"]
    assert main([*args, "--port", "9000"]) == 1
    assert "--port names one server" in capsys.readouterr().err


def test_facts_of_a_recorded_server_come_from_its_command_line(
    mur_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dtype and logprobs mode are not in vLLM's API: they are read from the argv `up` kept."""
    argv = ["python", "-m", "vllm", "--dtype", "float32", "--logprobs-mode", "raw_logprobs"]
    monkeypatch.setattr(facts, "recorded_command", lambda url: argv)
    monkeypatch.setattr(facts, "vllm_version", lambda url, timeout: "0.32.0")
    local = facts.server_facts("http://127.0.0.1:8022/v1", "m")
    assert (local.dtype, local.logprobs_mode, local.vllm_version) == (
        "float32",
        "raw_logprobs",
        "0.32.0",
    )
    assert local.cpu and local.cpu_flags is not None
    monkeypatch.setattr(facts, "recorded_command", lambda url: None)
    remote = facts.server_facts("http://gpu-host:8000/v1", "m")
    assert (remote.dtype, remote.logprobs_mode, remote.cpu) == (None, None, None)
