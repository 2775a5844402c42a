"""The servers `up` started (servers.processes.launcher), as their run records say: list them
with their health checked live (`status`), read what one serves from the command line that
started it (`recorded_command`, `served_weights`, `served_dtype`), stop one (`down`).

This is the side of the launcher that reads and removes records; the launcher writes them.
Each profile's records are guarded by one lock across processes (`profile_lock`), which `up`
holds while it starts a server and writes its record: so a `down` never races an `up`, and a
`status` never removes the record of a server that is being started.

A record can still go missing while its server runs (an older version judged it stale after a
clock step; a person deletes it). The ports say what runs: `status`, `up` and `down` look at the
process that holds a profile's port, and when `up` of this MUR_HOME started it and it serves
the profile's model they write its record again from the process itself (`adopt`), so
`status` lists it and `down` stops it. A server of another MUR_HOME, or one started by hand,
is reused by `up` but never recorded or stopped from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from mur.servers.clients.errors import ServerError, ServerUnavailable
from mur.servers.clients.probes import (
    check_endpoint,
    healthy,
    normalize_base_url,
    port_open,
    root_url,
)
from mur.servers.processes.model import manifest_weights, read_manifest
from mur.servers.processes.paths import mur_home, run_dir
from mur.servers.processes.pids import (
    STOP_GRACE_S,
    alive,
    command_of,
    create_time,
    elsewhere,
    identity,
    mark_stopped,
    output_file,
    port_owner,
    read_record,
    record_alive,
    record_path,
    recorded_port,
    remove_record,
    server_home,
    terminate,
    write_record,
)
from mur.servers.processes.profiles import Profile, flag_value, profiles


@dataclass
class RunningServer:
    """A server that answers (or was recorded): where it is and whether we started it."""

    profile: str
    base_url: str
    """OpenAI-compatible base URL, ending in /v1."""
    model: str
    """Served model name to pass as `model`."""
    pid: int | None
    healthy: bool
    started: bool
    """True when this call started it (so the caller owns stopping it)."""
    log_path: Path | None
    detail: str = ""
    """What else the record says (a router: its policy and replicas)."""
    weights: str | None = None
    """The weight format of the folder it serves (None: not a folder the project made)."""
    dtype: str | None = None
    """Its `--dtype` ("auto": not given, vLLM's choice; None: no command line known)."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (for `status --json`)."""
        data = asdict(self)
        data["log_path"] = str(self.log_path) if self.log_path else None
        return data


def profile_lock(profile: str) -> FileLock:
    """Serializes up/down of one profile across processes (e.g. parallel test sessions)."""
    path = run_dir() / f".{profile}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    # The lock file stays: a process of an older version may hold a lock on that same file.
    return FileLock(path, preserve_lock_file=True)


def down(profile_name: str, *, grace: float = STOP_GRACE_S) -> bool:
    """Stop the recorded server of a profile (SIGTERM its process group, then SIGKILL), and
    mark it stopped on purpose: a run using it stops instead of starting it again (`up`).

    Without a live record, the profile's server is still found on its port when this MUR_HOME
    started it (`adopt`). Returns False when nothing of this MUR_HOME was running (a stale
    record is removed). A server this package did not start is never touched; one that
    outlives SIGKILL keeps its record and raises ServerError.
    """
    with profile_lock(profile_name):
        profile = profiles().get(profile_name)
        if profile is not None:  # what a Healer serves; a test's or a replica's is not
            mark_stopped(profile_name)
        record = read_record(profile_name)
        if record is None or not record_alive(record):
            record = adopt(profile) if profile is not None else None
        if record is None:
            remove_record(profile_name)
            return False
        pid = int(record["pid"])
        if elsewhere(record):
            raise ServerError(
                f"the {profile_name} server (pid {pid} in {record['pid_ns']}) was started in "
                f"another pid namespace, which this process cannot signal: stop it from there "
                f"(its record: {record_path(profile_name)})"
            )
        terminate(pid, grace)
        if alive(pid):
            raise ServerError(
                f"the {profile_name} server (pid {pid}) still runs after SIGTERM and SIGKILL: "
                f"its record {record_path(profile_name)} is kept; look at `ps -o stat {pid}`"
            )
        remove_record(profile_name)
        return True


def recorded_profiles() -> list[str]:
    """Names of profiles with a run record (alive or not)."""
    folder = run_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def status(probe: Callable[[str], bool] = healthy) -> list[RunningServer]:
    """Every recorded server whose process still runs, with health checked live; servers of
    this MUR_HOME found on a profile's port without a record are recorded first (`adopt`).

    Records of dead processes are removed on the way.
    """
    adopt_unrecorded()
    servers = []
    for name in recorded_profiles():
        record = read_record(name)
        if record is None or not record_alive(record):
            _remove_dead_record(name)
            continue
        base_url = str(record.get("base_url", ""))
        argv = record_argv(record)
        detail = str(record.get("detail") or "")
        if elsewhere(record):
            detail = f"started in another pid namespace ({record['pid_ns']}) {detail}".strip()
        servers.append(
            RunningServer(
                profile=name,
                base_url=base_url,
                model=str(record.get("model", "")),
                pid=int(record["pid"]),
                healthy=probe(root_url(base_url)),
                started=False,
                log_path=Path(record["log"]) if record.get("log") else None,
                detail=detail,
                weights=served_weights(argv),
                dtype=served_dtype(argv),
            )
        )
    return servers


def live_records() -> dict[str, dict[str, Any]]:
    """Every record whose server still runs, by name."""
    found = {}
    for name in recorded_profiles():
        record = read_record(name)
        if record is not None and record_alive(record):
            found[name] = record
    return found


def record_on_port(port: int) -> tuple[str, dict[str, Any]] | None:
    """The live record of the server on `port` (a profile's, its router's, ...), if any."""
    for name, record in live_records().items():
        where = recorded_port(record)
        if where is not None and where[1] == port:
            return name, record
    return None


def ours(pid: int) -> bool:
    """Process `pid` was started by `up` of this MUR_HOME."""
    home = server_home(pid)
    return home is not None and home.resolve() == mur_home().resolve()


def serves(profile: Profile, argv: Sequence[str]) -> bool:
    """The server with command line `argv`, on the profile's port, serves its model: by its
    `--served-model-name` (vLLM's default: `--model`), else by what /v1/models lists."""
    named = flag_value(argv, "--served-model-name") or flag_value(argv, "--model")
    if named is not None:
        return named == profile.served_model_name
    try:
        return profile.served_model_name in check_endpoint(profile.base_url, timeout=3)
    except ServerUnavailable:
        return False


def adopt(profile: Profile) -> dict[str, Any] | None:
    """The record of the server on the profile's port, written again from its process, when
    `up` of this MUR_HOME started it and it serves the profile's model; None otherwise (nothing
    listens, another MUR_HOME's or a hand-started server, another model). The caller holds the
    profile's lock."""
    existing = read_record(profile.name)
    if existing is not None and record_alive(existing):
        return None  # one record a profile: never over a live one (on another port)
    if not port_open(profile.host, profile.port):
        return None
    pid = port_owner(profile.port)
    argv = command_of(pid) if pid is not None else None
    if pid is None or argv is None or not ours(pid) or not serves(profile, argv):
        return None
    log = output_file(pid)
    record = new_record(profile, pid, argv, log, "")
    record["started_at"] = create_time(pid)  # not now: it ran before its record was lost
    record["adopted_at"] = time.time()
    write_record(profile.name, record)
    return record


def new_record(
    profile: Profile, pid: int, argv: Sequence[str], log: Path | None, detail: str
) -> dict[str, Any]:
    """A run record: the process (`pid` and what tells it from a later one with that pid),
    where it serves, its log and the command line that started it."""
    return {
        "profile": profile.name,
        "pid": pid,
        **identity(pid),
        "port": profile.port,
        "base_url": profile.base_url,
        "model": profile.served_model_name,
        "log": str(log) if log else None,
        "argv": list(argv),
        "detail": detail,
        "started_at": time.time(),
    }


def adopt_unrecorded() -> list[str]:
    """Record the servers of this MUR_HOME that hold a profile's port without a live record
    (`adopt`); the profiles so recorded. A profile whose lock is held (an `up` or a `down` at
    work) is left to them."""
    held = {where[1] for r in live_records().values() if (where := recorded_port(r))}
    adopted = []
    for profile in profiles().values():
        if profile.port in held or not port_open(profile.host, profile.port):
            continue
        try:
            with profile_lock(profile.name).acquire(timeout=0):
                record = read_record(profile.name)
                if record is not None and record_alive(record):
                    continue
                if adopt(profile) is not None:
                    adopted.append(profile.name)
                    held.add(profile.port)
        except Timeout:
            continue
    return adopted


def _remove_dead_record(profile: str) -> None:
    """Remove the profile's record if it is still a dead one, under the profile's lock: an
    `up` that holds the lock may be writing the record of the server it starts. Busy: left
    for the next status."""
    try:
        with profile_lock(profile).acquire(timeout=0):
            record = read_record(profile)
            if record is None or not record_alive(record):
                remove_record(profile)
    except Timeout:
        return


def recorded_command(base_url: str) -> list[str] | None:
    """The argv that started the live recorded server at `base_url` (None: not started by
    `up`, or no longer running): what the server's own API does not say, such as its dtype."""
    wanted = normalize_base_url(base_url)
    for name in recorded_profiles():
        record = read_record(name)
        if record is None or not record_alive(record):
            continue
        if normalize_base_url(str(record.get("base_url", ""))) == wanted:
            return record_argv(record)
    return None


def record_argv(record: Mapping[str, Any]) -> list[str] | None:
    """The command line a run record says started its server (None: an older record)."""
    argv = record.get("argv")
    return [str(arg) for arg in argv] if isinstance(argv, list) else None


def served_dtype(argv: Sequence[str] | None) -> str | None:
    """The `--dtype` of a server's command line ("auto", vLLM's default, when it passed none;
    None when no command line is known)."""
    return (flag_value(argv, "--dtype") or "auto") if argv is not None else None


def served_weights(argv: Sequence[str] | None) -> str | None:
    """The weight format of the folder a server's command line serves (None: not a folder
    the project made, or no command line known)."""
    folder = flag_value(argv, "--model") if argv is not None else None
    manifest = read_manifest(Path(folder)) if folder else None
    return manifest_weights(manifest) if manifest is not None else None
