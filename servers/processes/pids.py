"""The server processes this machine started: which are still running, their pid records
(`<MUR_HOME>/run/<profile>.json`), the mark a deliberate stop leaves
(`<MUR_HOME>/run/<profile>.stopped`), who holds a port, and stopping a server with its
children.

A record knows its process again by the boot it was written in and the process's start in
clock ticks since that boot (`/proc/<pid>/stat`), which no step of the wall clock moves:
psutil's `create_time` is that start plus the boot time the wall clock implies now, so an NTP
or VM clock step of a second or more made a live server's record look like a reused pid, and
the next `status` removed it (issue 79). A record written in another pid namespace of this boot
(a container sharing MUR_HOME) names a pid that means nothing here: its port says whether it
runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from mur.servers.clients.probes import port_open
from mur.servers.processes.paths import run_dir

STOP_GRACE_S = 30.0
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""The servers this process started, by pid (their exit status is theirs to read)."""
SERVER_HOME_ENV = "MUR_SERVER_HOME"
"""Set in the environment of every server `up` starts: the MUR_HOME whose records it belongs
to, so a server whose record was lost is found again (servers.processes.running.adopt)."""


def create_time(pid: int) -> float | None:
    """When the process started (seconds since the epoch, as the wall clock says now: a clock
    step moves it). Shown to people; records compare `identity` instead."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


@functools.cache
def boot_id() -> str | None:
    """This boot's id (a reboot changes it); None where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


@functools.cache
def pid_namespace() -> str | None:
    """The pid namespace this process sees pids in (`pid:[4026531836]`); None if unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (field 22 of /proc/<pid>/stat):
    fixed for the process's life whatever the wall clock does. None if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def identity(pid: int) -> dict[str, Any]:
    """What a record keeps to know its process again (see the module's docstring)."""
    return {"boot_id": boot_id(), "pid_ns": pid_namespace(), "start_ticks": start_ticks(pid)}


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists; someone else's


def alive(pid: int) -> bool:
    """Running (not exited, not a zombie)."""
    child = CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        return _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def group_alive(pgid: int) -> bool:
    """Some non-zombie process is still in process group `pgid`."""
    for process in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(process.pid) == pgid and _running(process):
                return True
    return False


def record_path(profile: str) -> Path:
    return run_dir() / f"{profile}.json"


def read_record(profile: str) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(profile).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_record(profile: str, record: Mapping[str, Any]) -> None:
    path = record_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dict(record), indent=2) + "\n")
    tmp.replace(path)


def remove_record(profile: str) -> None:
    record_path(profile).unlink(missing_ok=True)


def stop_mark_path(profile: str) -> Path:
    return run_dir() / f"{profile}.stopped"


def mark_stopped(profile: str) -> None:
    """Note that the profile's server was stopped on purpose (`down`): a run's Healer must
    not start it again behind the person who stopped it. The next `up` clears it."""
    path = stop_mark_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{time.time():.3f}\n")


def stopped_at(profile: str) -> float | None:
    """When `down` stopped the profile's server (seconds since the epoch), if it is still
    meant to be down; None when no stop is in force."""
    try:
        return float(stop_mark_path(profile).read_text())
    except (OSError, ValueError):
        return None


def clear_stopped(profile: str) -> None:
    stop_mark_path(profile).unlink(missing_ok=True)


def recorded_port(record: Mapping[str, Any]) -> tuple[str, int] | None:
    """(host, port) a record's server listens on: its `port`, else its base URL's."""
    parts = urlsplit(str(record.get("base_url") or ""))
    port = record.get("port")
    if not isinstance(port, int):
        try:
            port = parts.port
        except ValueError:
            return None
    return (parts.hostname or "127.0.0.1", port) if isinstance(port, int) else None


def elsewhere(record: Mapping[str, Any]) -> bool:
    """Written in another pid namespace of this boot: its pid is not one this process sees."""
    theirs, ours = record.get("pid_ns"), pid_namespace()
    same_boot = record.get("boot_id") == boot_id()
    return theirs is not None and ours is not None and theirs != ours and same_boot


def record_alive(record: Mapping[str, Any]) -> bool:
    """The recorded server still runs: its pid is the same process (same boot, same start in
    ticks since boot). A record of another pid namespace lives while its port is held. An
    older record (a `create_time`, no boot id) lives while its start time matches within a
    second or its process still holds the recorded port; one with neither, while its pid
    runs."""
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    where = recorded_port(record)
    if elsewhere(record):
        return where is not None and port_open(*where)
    if not alive(pid):
        return False
    if record.get("boot_id") is not None:
        if boot_id() not in (None, record["boot_id"]):
            return False  # rebooted since: the pid is some later process's
        recorded, now = record.get("start_ticks"), start_ticks(pid)
        return recorded is None or now is None or recorded == now
    started, now_s = record.get("create_time"), create_time(pid)
    if started is None or now_s is None or abs(now_s - started) < 1.0:
        return True
    return where is not None and pid in listeners(where[1])


def listeners(port: int) -> list[int]:
    """The pids of this machine's processes that hold a listening TCP socket on `port`, as far
    as this process may see (a server's forked children inherit the socket: several)."""
    try:
        sockets = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return []
    return sorted(
        {
            s.pid
            for s in sockets
            if s.pid and s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port
        }
    )


def port_owner(port: int) -> int | None:
    """The process serving `port`: of those holding its listening socket, the one whose parent
    does not (vLLM's engine, forked by its API server, holds it too). None: nothing visible."""
    held = listeners(port)
    for pid in held:
        try:
            parent = psutil.Process(pid).ppid()
        except psutil.Error:
            continue
        if parent not in held:
            return pid
    return None


def server_home(pid: int) -> Path | None:
    """The MUR_HOME whose `up` started process `pid`: SERVER_HOME_ENV in its environment, else
    (servers started before it was set) the vLLM cache folder a CPU profile keeps in MUR_HOME.
    None: not started by `up`, or not this user's to read."""
    try:
        environ = psutil.Process(pid).environ()
    except psutil.Error:
        return None
    if environ.get(SERVER_HOME_ENV):
        return Path(environ[SERVER_HOME_ENV]).expanduser()
    cache = environ.get("VLLM_CACHE_ROOT")
    return Path(cache).parent if cache and Path(cache).name == "vllm-cache" else None


def command_of(pid: int) -> list[str] | None:
    """The command line of process `pid` (None if unreadable)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return None


def output_file(pid: int) -> Path | None:
    """The file the process's standard output goes to (a server's log), if it is one."""
    try:
        target = Path(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return None
    return target if target.is_file() else None


def _signal(pid: int, sig: signal.Signals, members: Sequence[psutil.Process]) -> None:
    """`sig` to the process group `pid` leads (as `up` starts servers; a leader that has exited
    leaves its group behind), else to the process and its children: a process found on a port
    may share its starter's group, which is not ours to stop."""
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        group = pid
    if group == pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        return
    for process in members:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def _members(pid: int) -> list[psutil.Process]:
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def _gone(pid: int, members: Sequence[psutil.Process]) -> bool:
    return (
        not alive(pid)
        and not group_alive(pid)
        and not any(_running(member) for member in members if member.pid != pid)
    )


def terminate(pid: int, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the server `pid` with its children (its process group when it leads one), wait
    up to `grace` s, then SIGKILL what is left. The caller checks `alive(pid)` after."""
    members = _members(pid)
    _signal(pid, signal.SIGTERM, members)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _gone(pid, members):
            break
        time.sleep(0.2)
    else:
        _signal(pid, signal.SIGKILL, [*members, *_members(pid)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _gone(pid, members):
            time.sleep(0.1)
    child = CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
