"""A live server never loses its record (issue 79, item 4), and `status`, `up` and `down`
agree with the processes that hold the ports.

The servers are fake ones (tests/unit/test_servers.py's `serving`: a process answering like
vLLM), each test in a MUR_HOME of its own and on free ports, so the machine's real servers and
their records are never touched: a server is found again only by the MUR_HOME that started it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_servers import free_port, serving, tiny_on

from mur.cli.servers import main
from mur.servers.clients.errors import ServerError
from mur.servers.processes import launcher, pids, running
from mur.servers.processes.profiles import Profile
from waiting import wait_until

pytestmark = pytest.mark.usefixtures("mur_home")  # tests/unit/conftest.py


@pytest.fixture
def profile(monkeypatch: pytest.MonkeyPatch) -> Profile:
    """cpu-tiny on a free port, and the only profile `status` and `down` look for on its port
    (the machine's own cpu-tiny on 8011 belongs to another MUR_HOME in any case)."""
    tiny = tiny_on(free_port())
    monkeypatch.setattr(running, "profiles", lambda: {tiny.name: tiny})
    return tiny


@contextmanager
def started(profile: Profile) -> Iterator[launcher.RunningServer]:
    """The profile's fake server started by `up` (recorded); stopped at the end if it runs."""
    server = launcher.up(profile, progress=False, timeout=30, command=serving(profile.port))
    try:
        yield server
    finally:
        if server.pid is not None and pids.alive(server.pid):
            pids.terminate(server.pid, grace=5)


def record_file(home: Path, name: str = "cpu-tiny") -> Path:
    return home / "run" / f"{name}.json"


# ------------------------------------------------------------- how a record is judged


def test_a_clock_step_leaves_a_live_servers_record(
    mur_home: Path, profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cause seen in issue 79: psutil's create_time is the start in ticks since boot plus
    the boot time the wall clock implies now, so a clock step of a second or more moved it
    and the next `status` took the live server for a reused pid and removed its record."""
    with started(profile) as server:
        real = pids.create_time

        def stepped(pid: int) -> float | None:  # the wall clock stepped an hour forward
            before = real(pid)
            return None if before is None else before + 3600

        monkeypatch.setattr(pids, "create_time", stepped)
        assert [(s.profile, s.pid) for s in launcher.status()] == [("cpu-tiny", server.pid)]
        record = json.loads(record_file(mur_home).read_text())
        assert record["pid"] == server.pid and record["start_ticks"] == pids.start_ticks(server.pid)
        # A record an older version wrote (create_time, no boot id) survives the step too:
        # its process still holds the recorded port.
        older = {"pid": server.pid, "port": profile.port, "create_time": real(server.pid)}
        assert pids.record_alive(older)
        assert launcher.down("cpu-tiny") is True
    assert not pids.alive(server.pid)


def test_a_reused_pid_or_a_reboot_is_not_taken_for_the_server() -> None:
    me = os.getpid()
    mine = {"pid": me, **pids.identity(me)}
    assert pids.record_alive(mine)
    assert not pids.record_alive({**mine, "start_ticks": mine["start_ticks"] + 1})
    assert not pids.record_alive({**mine, "boot_id": "another-boot"})
    # An older record whose start time does not match and whose pid holds no recorded port:
    # some other process now has that number.
    stale = {"pid": me, "create_time": pids.create_time(me) - 100, "port": free_port()}
    assert not pids.record_alive(stale)


def test_a_record_from_another_pid_namespace_is_judged_by_its_port(
    mur_home: Path, profile: Profile
) -> None:
    """A container sharing MUR_HOME records pids this process cannot see: while the recorded
    port is held the record lives (listed, not signalled); once it is free, it is stale."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        record = {
            "pid": 2**22 + 4321,  # above pid_max: no process here has it
            "pid_ns": "pid:[4026500001]",
            "boot_id": pids.boot_id(),
            "start_ticks": 5,
            "port": port,
            "base_url": f"http://127.0.0.1:{port}/v1",
            "model": "m",
        }
        pids.write_record("cpu-tiny-r1", record)
        (listed,) = launcher.status()
        assert listed.profile == "cpu-tiny-r1" and "another pid namespace" in listed.detail
        with pytest.raises(ServerError) as refused:
            launcher.down("cpu-tiny-r1")
        assert "pid 4198625 in pid:[4026500001]" in str(refused.value)
        assert "\n" not in str(refused.value) and record_file(mur_home, "cpu-tiny-r1").exists()
    assert launcher.status() == [] and not record_file(mur_home, "cpu-tiny-r1").exists()


# -------------------------------------------------------- a lost record is found again


def test_status_up_and_down_find_a_server_whose_record_was_lost(
    mur_home: Path, profile: Profile, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 79: the record gone while the server runs (another checkout's status, a person),
    `up` said `reused ... pid=None` and wrote nothing, `status` saw nothing and `down --all`
    stopped nothing. Each of them now finds the process on the profile's port and writes its
    record again."""
    with started(profile) as server:
        log = mur_home / "logs" / "cpu-tiny.log"
        record_file(mur_home).unlink()
        assert main(["status"]) == 0
        out, err = capsys.readouterr()
        assert out.startswith(f"cpu-tiny: {profile.base_url} model=SmolLM2-135M-Instruct ")
        assert f" pid={server.pid} healthy log={log}\n" in out
        assert "cpu-tiny: its server runs on its port without a record" in err
        record = json.loads(record_file(mur_home).read_text())
        assert (record["pid"], record["port"]) == (server.pid, profile.port)
        assert record["log"] == str(log) and record["argv"] == serving(profile.port)

        record_file(mur_home).unlink()
        assert main(["up", "--profile", "cpu-tiny", "--port", str(profile.port), "--quiet"]) == 0
        out = capsys.readouterr().out
        reused = f"cpu-tiny: reused {profile.base_url} model=SmolLM2-135M-Instruct"
        assert f"{reused} pid={server.pid}\n" in out
        assert json.loads(record_file(mur_home).read_text())["pid"] == server.pid

        record_file(mur_home).unlink()
        assert main(["down", "--all"]) == 0
        assert "cpu-tiny: stopped" in capsys.readouterr().out
        assert not pids.alive(server.pid) and not record_file(mur_home).exists()


def test_a_server_of_another_mur_home_is_reused_but_never_recorded_or_stopped(
    tmp_path: Path, profile: Profile, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    first = tmp_path / "mur-home"
    with started(profile) as server:
        other = tmp_path / "other-home"
        monkeypatch.setenv("MUR_HOME", str(other))
        reused = launcher.up(profile, progress=False, command=["false"])
        assert (reused.started, reused.pid) == (False, server.pid)
        assert f"pid {server.pid} was started by `mur servers up` with MUR_HOME={first}" in (
            reused.detail
        )
        assert main(["up", "--profile", "cpu-tiny", "--port", str(profile.port), "--quiet"]) == 0
        said = capsys.readouterr().out.splitlines()
        assert said[0].endswith(f" pid={server.pid}") and said[1] == f"  {reused.detail}"
        assert said[1].startswith(f"  not recorded in {other}: ")
        assert launcher.status() == [] and not record_file(other).exists()
        assert launcher.down("cpu-tiny") is False
        assert main(["down", "--all"]) == 0
        assert capsys.readouterr().out == "no recorded servers\n"
        assert pids.alive(server.pid)
        monkeypatch.setenv("MUR_HOME", str(first))
        assert launcher.down("cpu-tiny") is True
    assert not pids.alive(server.pid)


def test_down_stops_a_found_server_without_its_starters_process_group(
    mur_home: Path, profile: Profile
) -> None:
    """A server found on its port may share its starter's process group (here this test's):
    `down` stops that process and its children, not the group, and not by a signal to a
    group it does not lead (which reached nothing, and the record went anyway)."""
    env = {**os.environ, pids.SERVER_HOME_ENV: str(mur_home)}
    process = subprocess.Popen(serving(profile.port), env=env)
    try:
        assert wait_until(lambda: pids.port_owner(profile.port) == process.pid, 30)
        assert os.getpgid(process.pid) == os.getpgrp()
        assert launcher.down("cpu-tiny", grace=10) is True
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not record_file(mur_home).exists()


def test_down_keeps_the_record_of_a_server_it_could_not_stop(
    mur_home: Path, profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    with started(profile) as server:
        monkeypatch.setattr(running, "terminate", lambda pid, grace: None)  # a kill not taken
        with pytest.raises(ServerError) as kept:
            launcher.down("cpu-tiny")
        said = str(kept.value)
        assert f"the cpu-tiny server (pid {server.pid}) still runs after SIGTERM" in said
        assert str(record_file(mur_home)) in said and "\n" not in said
        assert json.loads(record_file(mur_home).read_text())["pid"] == server.pid


# ------------------------------------------------- up never kills what it did not start


def test_up_on_another_port_leaves_the_profiles_live_server_alone(
    mur_home: Path, profile: Profile
) -> None:
    """One record a profile: `up --port B` while its server runs on port A used to wait for
    A's pid to answer on B, then stop it at the deadline."""
    with started(profile) as server:
        elsewhere = tiny_on(free_port())
        with pytest.raises(ServerError) as refused:
            launcher.up(elsewhere, progress=False, timeout=5, command=serving(elsewhere.port))
        said = str(refused.value)
        assert f"runs on port {profile.port} (pid {server.pid}), not {elsewhere.port}" in said
        assert pids.alive(server.pid)
        assert json.loads(record_file(mur_home).read_text())["port"] == profile.port


def test_waiting_for_a_server_another_up_is_starting_never_stops_it(
    mur_home: Path, profile: Profile
) -> None:
    """Another `up` (a longer deadline of its own) is starting the server: this one gives up
    at its deadline and leaves the server and its record alone."""
    slow = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        record = running.new_record(profile, slow.pid, ["python", "-c", "sleep"], None, "")
        pids.write_record("cpu-tiny", record)
        with pytest.raises(ServerError) as late:
            launcher.up(profile, progress=False, timeout=0.5, command=["false"])
        said = str(late.value)
        assert f"(pid {slow.pid}, started by another `mur servers up`)" in said
        assert "is left running" in said and "\n" not in said
        assert slow.poll() is None and record_file(mur_home).exists()
    finally:
        slow.kill()
        slow.wait()
