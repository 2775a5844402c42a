"""A supervisor's children do not outlive it, even when it is SIGKILLed
(servers/processes/orphans.py), and the router's environment holds no secret.

The supervisor is SIGKILLed in a process of its own: `mur endpoint --replicas 2` for real (the
tests' PostgreSQL, the scripted backbone, the real vllm-router), and a small driver of the
Supervisor over stand-in children (no PostgreSQL needed) whose router ignores SIGTERM and has
a child of its own, and whose replica was restarted from a thread that ended before the kill
(as `mur bench chaos` restarts them). Each test runs its supervisor in a session of its own
and kills whatever is left in that session on the way out, so a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest

from faulty_server import MODEL, faulty_server
from mur.endpoint.supervisor import Child, Supervisor
from mur.servers.clients import probes
from mur.servers.processes import supervisor as supervisor_module
from mur.servers.processes.orphans import Tether
from mur.servers.processes.replicas import ROUTER_ENV, router_env
from postgres import PASSWORD, PostgresServer, free_port
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FAKE_REPLICA = ROOT / "tests" / "fake_replica.py"
GONE_WITHIN_S = 15.0
"""The watchers' escalation takes at most 5 s (orphans.ESCALATION); the rest is a busy CI."""
API_KEY = "key-for-the-replicas-only"
BACKBONE_KEY = "sk-planted-backbone-key"


def free_ports(count: int) -> int:
    """A port p with p .. p+count-1 all free now."""
    while True:
        first = free_port()
        if first + count <= 65535 and all(port_free(first + i) for i in range(count)):
            return first


def port_free(port: int) -> bool:
    """Nothing listens on `port` of the loopback interface (a server could bind it again)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def healthy(root: str) -> bool:
    try:
        return httpx.get(f"{root}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def in_session(sid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of session `sid`."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


@contextlib.contextmanager
def supervisor_process(command: list[str], env: dict[str, str], log: Path) -> Iterator[int]:
    """`command` in a session of its own (its pid is the session's id); SIGKILL to whatever
    of that session is left at the end."""
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process.pid
    finally:
        for left in in_session(process.pid):
            with contextlib.suppress(psutil.Error):
                left.kill()
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(30)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def check_gone(session: int, ports: range, log: Path) -> None:
    """Nothing of `session` runs any more and every port is free, within GONE_WITHIN_S."""
    begin = time.monotonic()
    gone = wait_until(lambda: not in_session(session), GONE_WITHIN_S, every=0.1)
    left = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in in_session(session)]
    assert gone, f"still running {GONE_WITHIN_S} s after the kill: {left}\n{log.read_text()}"
    free = wait_until(
        lambda: all(port_free(p) for p in ports), GONE_WITHIN_S - (time.monotonic() - begin)
    )
    assert free, [p for p in ports if not port_free(p)]


def test_a_sigkilled_endpoint_supervisor_takes_its_replicas_and_router_along(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """`mur endpoint --replicas 2` up behind the real router: the replicas hold the
    checkpointer URL and the API key in their environment, the router none of it (nor the
    backbone's key the supervisor was given); SIGKILL the supervisor, and within seconds
    no replica, router or watcher runs and all three ports are free."""
    url = postgres.create_database("supervisor_death")
    port = free_ports(3)
    log = tmp_path / "supervisor.log"
    env = {**os.environ, "MUR_CHECKPOINTER": url, "MUR_API_KEY": API_KEY}
    env |= {"OPENAI_API_KEY": BACKBONE_KEY, "PGPASSWORD": PASSWORD}
    with faulty_server(["ok"]) as server:
        command = [sys.executable, "-m", "mur", "endpoint", "--replicas", "2"]
        command += ["--port", str(port), "--base-url", server.base_url, "--model", MODEL]
        with supervisor_process([*command, "--log-level", "warning"], env, log) as supervisor:
            router_root = f"http://127.0.0.1:{port}"
            up = wait_until(lambda: healthy(router_root) or not in_session(supervisor), 120, 0.2)
            assert up and in_session(supervisor), log.read_text()[-3000:]
            programs = psutil.Process(supervisor).children()
            replicas = [p for p in programs if "mur.cli.endpoint" in p.cmdline()]
            [router] = [p for p in programs if p not in replicas]
            assert len(replicas) == 2
            for replica in replicas:
                assert environ(replica.pid)["MUR_CHECKPOINTER"] == url
                assert environ(replica.pid)["MUR_API_KEY"] == API_KEY
            seen = environ(router.pid)
            assert {k for k in seen if not k.startswith("LC_")} <= ROUTER_ENV | {"PYTHONUNBUFFERED"}
            for secret in (PASSWORD, API_KEY, BACKBONE_KEY):
                assert not any(secret in value for value in seen.values())
            os.kill(supervisor, signal.SIGKILL)
            check_gone(supervisor, range(port, port + 3), log)


DRIVER = """
import os, sys, threading, time
from mur.endpoint import supervisor as supervisor_module
from mur.endpoint.supervisor import Child, Supervisor
from mur.servers.clients import probes

fake, port = sys.argv[1], int(sys.argv[2])
def replica(name, port):
    command = [sys.executable, fake, str(port), "model"]
    return Child(name, command, f"http://127.0.0.1:{port}")
# The router's stand-in ignores SIGTERM and starts a child in its own process group.
stubborn = (
    "import runpy, signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
router = Child("router", [sys.executable, "-c", stubborn, fake, str(port), "model"],
               f"http://127.0.0.1:{port}")
supervisor = Supervisor([replica("r1", port + 1), replica("r2", port + 2)], router,
                        env=os.environ, out=sys.stderr, prog="driver")
supervisor.start()
killed = supervisor.kill(0)

def restart():  # as the chaos benchmark's monkey does, from a thread that then ends
    while not supervisor.replicas[0].ready or supervisor.replicas[0].pid == killed:
        supervisor.check()
        time.sleep(0.1)

thread = threading.Thread(target=restart)
thread.start()
thread.join()
print("restarted", supervisor.replicas[0].pid, flush=True)
time.sleep(600)
"""


def test_children_die_with_a_sigkilled_supervisor_even_stubborn_ones(tmp_path: Path) -> None:
    """SIGKILL a Supervisor whose router ignores SIGTERM and has a child in its group, and
    whose first replica was restarted from a thread that has ended: the restarted replica
    outlives that thread, and after the kill nothing of them runs and the ports are free."""
    port = free_ports(3)
    log = tmp_path / "driver.log"
    command = [sys.executable, "-c", DRIVER, str(FAKE_REPLICA), str(port)]
    with supervisor_process(command, dict(os.environ), log) as supervisor:
        assert wait_until(lambda: "restarted" in log.read_text(), 60, every=0.1), log.read_text()
        restarted = int(re.findall(r"restarted (\d+)", log.read_text())[0])
        time.sleep(0.5)  # a child tied to the thread that forked it would be dead by now
        assert running(restarted) and healthy(f"http://127.0.0.1:{port + 1}")
        router = next(
            p for p in psutil.Process(supervisor).children() if "runpy" in " ".join(p.cmdline())
        )
        assert any("sleep(600)" in " ".join(p.cmdline()) for p in router.children())
        os.kill(supervisor, signal.SIGKILL)
        check_gone(supervisor, range(port, port + 3), log)


def test_a_watcher_leaves_with_its_program_and_lets_its_output_end() -> None:
    """A replica killed on its own (a crash, the chaos benchmark) leaves no watcher behind,
    and the supervisor reading its output sees the end of it."""
    tether = Tether()
    code = "print('up', flush=True); import time; time.sleep(600)"
    program = subprocess.Popen(
        tether.command([sys.executable, "-c", code]),
        stdout=subprocess.PIPE,
        text=True,
        process_group=0,
        pass_fds=tether.pass_fds,
    )
    try:
        assert program.stdout is not None and program.stdout.readline() == "up\n"
        [watcher] = psutil.Process(program.pid).children()
        program.kill()
        assert program.stdout.read() == ""  # EOF: the watcher does not hold the pipe
        program.wait(10)
        assert wait_until(lambda: not running(watcher.pid), 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(program.pid, signal.SIGKILL)
        program.wait(10)
        tether.close()


def running(pid: int) -> bool:
    """Not exited (a zombie has)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_program_that_cannot_be_run_exits_127_saying_why() -> None:
    tether = Tether()
    try:
        done = subprocess.run(
            tether.command(["/nonexistent/program", "--flag"]), capture_output=True, text=True,
            pass_fds=tether.pass_fds, timeout=30,
        )  # fmt: skip
    finally:
        tether.close()
    assert done.returncode == 127
    assert "cannot run /nonexistent/program" in done.stderr
    with pytest.raises(ValueError, match="closed"):
        tether.command(["true"])


def test_the_router_gets_only_what_vllm_router_needs() -> None:
    given = {
        "PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "RUST_LOG": "warn",
        "MUR_CHECKPOINTER": f"postgresql://mur:{PASSWORD}@h/db", "MUR_API_KEY": API_KEY,
        "PGPASSWORD": PASSWORD, "OPENAI_API_KEY": BACKBONE_KEY, "HF_TOKEN": "hf_x",
        "HTTPS_PROXY": "http://user:pw@proxy:3128",
    }  # fmt: skip
    assert router_env(given) == {
        "PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "RUST_LOG": "warn",
        "PYTHONUNBUFFERED": "1",
    }  # fmt: skip


def test_the_supervisor_gives_the_router_its_own_environment() -> None:
    """By default the router's environment is router_env's, whatever the replicas get."""
    child = Child("r1", ["true"], "http://127.0.0.1:1")
    router = Child("router", ["true"], "http://127.0.0.1:2")
    replicas_env = {**os.environ, "MUR_API_KEY": API_KEY}
    supervisor = Supervisor([child], router, env=replicas_env, out=sys.stderr, prog="t")
    try:
        assert supervisor.router_env == router_env()
        assert supervisor.env["MUR_API_KEY"] == API_KEY
    finally:
        supervisor.close()


# A stand-in replica that drains as a real one does: SIGTERM ends it with status 0.
GRACEFUL = (
    "import runpy, signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
NEVER_READY = [sys.executable, "-c", "import time; time.sleep(600)"]


def stand_ins(port: int, first: list[str] | None = None) -> Supervisor:
    """Two graceful stand-in replicas on port+1, port+2 (the first's command may be given)
    behind a stand-in router on `port`."""

    def replica(name: str, at: int) -> Child:
        command = [sys.executable, "-c", GRACEFUL, str(FAKE_REPLICA), str(at), MODEL]
        return Child(name, command, f"http://127.0.0.1:{at}")

    router = Child(
        "router", [sys.executable, str(FAKE_REPLICA), str(port), MODEL], f"http://127.0.0.1:{port}"
    )
    replicas = [replica("r1", port + 1), replica("r2", port + 2)]
    if first is not None:
        replicas[0].command = first
    return Supervisor(replicas, router, env=os.environ, out=sys.stderr, prog="t")


@pytest.mark.parametrize("state", ["dead, its restart pending", "started again, not answering"])
def test_a_replica_between_death_and_restart_does_not_fail_the_drain(state: str) -> None:
    """A stop signal while a replica is down (killed, restart scheduled) or starting again:
    the serving replicas drain and exit 0, so the supervisor exits 0 (it said 1 when a SIGTERM
    met a replica the supervisor was restarting)."""
    supervisor = stand_ins(free_ports(3))
    try:
        supervisor.start(timeout=60)
        first = supervisor.replicas[0]
        supervisor.kill(0)
        assert wait_until(lambda: not first.alive(), 10)
        supervisor.check()  # its death is seen and its restart scheduled
        assert first.start_after > 0
        if state.startswith("started"):
            first.command, first.start_after = NEVER_READY, time.monotonic()
            supervisor.check()
            assert first.alive() and not first.ready
        assert supervisor.drain(10, lambda: 1) == 0
        assert supervisor.replicas[1].process.returncode == 0
    finally:
        supervisor.close()


def test_a_first_replica_started_alone_is_not_held_to_the_start_timeout(monkeypatch) -> None:
    """It may fetch, convert and start the embedded model server (minutes on a busy machine,
    bounded by that server's own timeouts): the start timeout counts from its answer. The
    supervisor's clock jumps ten timeouts while the first replica starts (as a long model start
    looks to it); the others and the router then have a whole timeout of the real clock."""
    timeout = 60.0
    jumped = [0.0]
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + jumped[0], sleep=time.sleep)
    port = free_ports(3)
    first_root = f"http://127.0.0.1:{port + 1}"

    def healthy(root: str) -> bool:
        answers = probes.healthy(root)
        if answers and root == first_root and not jumped[0]:
            jumped[0] = 10 * timeout
        return answers

    monkeypatch.setattr(supervisor_module, "time", clock)
    monkeypatch.setattr(supervisor_module, "healthy", healthy)
    supervisor = stand_ins(port)
    try:
        supervisor.start(first_alone=True, timeout=timeout)
        assert jumped[0] and all(child.ready for child in supervisor.replicas)
    finally:
        supervisor.close()


# Drains as a real replica does: the first SIGTERM starts a long drain, the second exits now.
TWO_SIGNALS = (
    "import runpy, signal, sys\n"
    "seen = []\n"
    "def handle(*_):\n"
    "    seen.append(1)\n"
    "    if len(seen) > 1: sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, handle)\n"
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_a_second_signal_reaches_every_replica_even_when_signals_merge() -> None:
    """Two SIGTERMs sent together may arrive as one; forced replicas get SIGTERM again each
    second until they exit, so they exit of their own accord, not by SIGKILL at the grace."""
    port = free_ports(3)
    command = [sys.executable, "-c", TWO_SIGNALS, str(FAKE_REPLICA), str(port + 1), MODEL]
    supervisor = stand_ins(port, first=command)
    try:
        supervisor.start(timeout=60)
        assert supervisor.drain(20, lambda: 2) == 1  # forced: not a clean drain
        # Its own exit (status 0), not the SIGKILL at the 20 s grace (-9).
        assert supervisor.replicas[0].process.returncode == 0
    finally:
        supervisor.close()


def test_a_restart_the_system_refuses_is_tried_again_later(monkeypatch, capsys) -> None:
    """fork failing (no memory) while a dead replica is restarted: said, tried again after a
    longer pause, not a traceback that skips the drain."""
    port = free_ports(3)
    supervisor = stand_ins(port)
    try:
        supervisor.start(timeout=60)
        first = supervisor.replicas[0]
        supervisor.kill(0)
        assert wait_until(lambda: not first.alive(), 10)
        supervisor.check()
        real = subprocess.Popen

        def refused(*args, **kwargs):
            raise OSError(12, "Cannot allocate memory")

        monkeypatch.setattr(subprocess, "Popen", refused)
        first.start_after = time.monotonic()
        supervisor.check()
        assert "could not start r1: [Errno 12] Cannot allocate memory: trying again in 2 s" in (
            capsys.readouterr().err
        )
        monkeypatch.setattr(subprocess, "Popen", real)
        first.start_after = time.monotonic()
        supervisor.check()
        assert wait_until(lambda: (supervisor.check(), first.ready)[1], 30)
        assert first.restarts == 1
    finally:
        supervisor.close()
