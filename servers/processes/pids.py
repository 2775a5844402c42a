"""The server processes this machine started: which are still running, their pid records
(`<MUR_HOME>/run/<profile>.json`, with the start time that tells a reused pid apart), the
mark a deliberate stop leaves (`<MUR_HOME>/run/<profile>.stopped`), and stopping a server's
whole process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from mur.servers.processes.paths import run_dir

STOP_GRACE_S = 30.0
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""The servers this process started, by pid (their exit status is theirs to read)."""


def create_time(pid: int) -> float | None:
    """When the process started (seconds since the epoch): guards against PID reuse."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


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


def record_alive(record: Mapping[str, Any]) -> bool:
    """The recorded PID still runs and is the same process (start time matches). Records
    written before start times were kept as `create_time` carry none: the PID decides."""
    pid = record.get("pid")
    if not isinstance(pid, int) or not alive(pid):
        return False
    started = record.get("create_time")
    now = create_time(pid)
    return started is None or now is None or abs(now - started) < 1.0


def terminate(pid: int, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group of `pid`, wait up to `grace` s, then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid) and not group_alive(pid):
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (alive(pid) or group_alive(pid)):
            time.sleep(0.1)
    child = CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
