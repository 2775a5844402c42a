"""The servers `up` started (servers.processes.launcher), as their run records say: list them
with their health checked live (`status`), read what one serves from the command line that
started it (`recorded_command`, `served_weights`, `served_dtype`), stop one (`down`).

This is the side of the launcher that reads and removes records; the launcher writes them.
Each profile's records are guarded by one lock across processes (`profile_lock`), which `up`
holds while it starts a server and writes its record: so a `down` never races an `up`, and a
`status` never removes the record of a server that is being started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from mur.servers.clients.probes import healthy, normalize_base_url, root_url
from mur.servers.processes.model import manifest_weights, read_manifest
from mur.servers.processes.paths import run_dir
from mur.servers.processes.pids import (
    STOP_GRACE_S,
    mark_stopped,
    read_record,
    record_alive,
    remove_record,
    terminate,
)
from mur.servers.processes.profiles import flag_value, profiles


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

    Returns False when nothing recorded was running (a stale record is removed). A server this
    package did not start (no record) is never touched.
    """
    with profile_lock(profile_name):
        if profile_name in profiles():  # what a Healer serves; a test's or a replica's is not
            mark_stopped(profile_name)
        record = read_record(profile_name)
        if record is None:
            return False
        if not record_alive(record):
            remove_record(profile_name)
            return False
        terminate(int(record["pid"]), grace)
        remove_record(profile_name)
        return True


def recorded_profiles() -> list[str]:
    """Names of profiles with a run record (alive or not)."""
    folder = run_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def status(probe: Callable[[str], bool] = healthy) -> list[RunningServer]:
    """Every recorded server whose process still runs, with health checked live.

    Records of dead processes are removed on the way.
    """
    servers = []
    for name in recorded_profiles():
        record = read_record(name)
        if record is None or not record_alive(record):
            _remove_dead_record(name)
            continue
        base_url = str(record.get("base_url", ""))
        argv = record_argv(record)
        servers.append(
            RunningServer(
                profile=name,
                base_url=base_url,
                model=str(record.get("model", "")),
                pid=int(record["pid"]),
                healthy=probe(root_url(base_url)),
                started=False,
                log_path=Path(record["log"]) if record.get("log") else None,
                detail=str(record.get("detail") or ""),
                weights=served_weights(argv),
                dtype=served_dtype(argv),
            )
        )
    return servers


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
