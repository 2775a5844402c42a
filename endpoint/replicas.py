"""`mur endpoint --replicas N`: N endpoint processes sharing one PostgreSQL checkpointer, with
vllm-router in front, started and stopped by one foreground command.

    mur endpoint --replicas 2 --port 8100 --checkpointer postgresql://USER:PASSWORD@HOST/DB

The router listens on `--host`:`--port` (loopback by default), the replicas on 127.0.0.1,
ports P+1 .. P+N; clients use the router's URL. Any replica resumes any run from the shared
checkpoints, so the router may send a retry anywhere: `round_robin`. It retries a request that
failed on one replica (503 while draining, a refused connection, any 5xx: a keyless run whose
backbone fails is run again) on another, 2N attempts in all. Every other flag goes to each
replica as given; the checkpointer URL and the API keys go in their environment, never in a
command line `ps` shows, and never to the router, whose environment holds only what
vllm-router needs (servers.processes.replicas.router_env).

Why vllm-router and not nginx: it is already a dependency (the model servers' replicas use
it), forwards the `mur` field and the Idempotency-Key and Authorization headers, and retries
a 503 on another replica (6 of 6 requests answered 200 with one replica draining); nginx
would be a system package a fresh clone lacks, doing nothing here the router does not. The
router adds SGLang's sampling fields to each body (`ignore_eos`, `no_stop_trim`, ...): the
endpoint ignores them, and a run's fingerprint holds only model, messages, `mur` and seed.

Ctrl-C or SIGTERM: each replica gets one SIGTERM and drains (endpoint/drain.py), then the
router stops; a second signal makes the replicas exit at once. Killed without a word (SIGKILL,
the OOM killer), the supervisor still takes the replicas and the router along within seconds
(servers/processes/orphans.py), so the same command can start again on the same ports.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import mur
from mur.endpoint.checkpointing import CHECKPOINTER_ENV, check_checkpointer
from mur.endpoint.supervisor import Supervisor
from mur.persistence.checkpointers import CheckpointerError, parse_target
from mur.servers.clients.errors import ServerError
from mur.servers.processes.replicas import check_router_installed, router_command
from mur.servers.processes.supervisor import Child

ROUTER_POLICY = "round_robin"
ROUTER_REQUEST_TIMEOUT_S = 6 * 3600
"""A whole solve may take an hour or more on a CPU: the router's default 1800 s would cut it."""
ROUTER_CIRCUIT_S = 5
"""The router's default keeps a replica out for 60 s after 3 failed requests: a replica killed
and restarted within seconds stayed out, and when the other one died meanwhile every request
got 503 "No available workers" for most of a minute (the chaos benchmark, kills 5-8 s apart)."""
REPLICA_HOST = "127.0.0.1"
API_KEY_ENV = "MUR_API_KEY"
NOT_PASSED_ON = {"help", "replicas", "host", "port", "checkpointer", "api_key", "replica_id"}
"""Flags the supervisor sets per replica (or passes in the environment) instead."""
CLOSE_MARGIN_S = 20.0
"""Beyond a replica's drain period: its last connections closing and its interpreter exiting."""


def replica_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The flags given to the supervisor that each replica takes as they are (what differs
    from the parser's defaults, but the ones in NOT_PASSED_ON)."""
    argv: list[str] = []
    for action in parser._actions:  # argparse has no public list of its flags
        if action.dest in NOT_PASSED_ON or not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # store_true
            argv.append(flag)
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def router_argv(ports: Sequence[int], host: str, port: int) -> list[str]:
    """vllm-router over the replicas: round robin, a failed request tried again (2N attempts
    in all: concurrent requests move the round on, so a retry may meet the same dead
    replica), a replica's open circuit (3 failed requests)
    tried again after ROUTER_CIRCUIT_S, and no time limit shorter than a long solve."""
    workers = [f"http://{REPLICA_HOST}:{p}" for p in ports]
    return router_command(
        workers,
        port=port,
        policy=ROUTER_POLICY,
        host=host,
        retries=2 * len(ports),
        circuit_open_s=ROUTER_CIRCUIT_S,
        request_timeout_s=ROUTER_REQUEST_TIMEOUT_S,
    )


def child_env(checkpointer: str, api_key: Sequence[str] | None) -> dict[str, str]:
    """The replicas' environment: the supervisor's (a replica is `mur endpoint`, which reads
    the backbone's URL and key, PG* and the embedded server's variables from it) with the
    checkpointer and the keys out of their command lines, and the same `mur` package
    importable wherever the supervisor was started. The router gets none of it."""
    env = {**os.environ, CHECKPOINTER_ENV: checkpointer, "PYTHONUNBUFFERED": "1"}
    env.pop(API_KEY_ENV, None)
    if api_key:
        env[API_KEY_ENV] = ",".join(api_key)
    package_root = str(Path(mur.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


class Signals:
    """Counts SIGINT/SIGTERM while installed; the first also sets the supervisor stopping."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.count, self.supervisor = 0, supervisor
        self.before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in self.before:
            signal.signal(sig, self.handle)

    def handle(self, sig: int, frame: FrameType | None) -> None:
        self.count += 1
        self.supervisor.stopping = True  # a flag: no lock taken inside a signal handler

    def restore(self) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler)


def serve_replicas(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    api_key: Sequence[str] | None,
    checkpointer: str,
    prog: str,
) -> int:
    """Run N replicas and their router in the foreground until a signal; 0 when every replica
    drained and exited 0, 1 when something failed. The flags were checked by the command
    (cli/endpoint.py: check_replicas): a PostgreSQL checkpointer, room for N ports."""
    try:
        check_router_installed()
        check_checkpointer(checkpointer)
    except (ServerError, CheckpointerError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    ports = [args.port + 1 + i for i in range(args.replicas)]
    shared = replica_argv(parser, args)
    replicas = []
    for index, port in enumerate(ports):
        command = [sys.executable, "-m", "mur.cli.endpoint", "--host", REPLICA_HOST]
        command += ["--port", str(port), *shared]
        if args.replica_id:
            command += ["--replica-id", f"{args.replica_id}-r{index + 1}"]
        replicas.append(Child(f"r{index + 1}", command, f"http://{REPLICA_HOST}:{port}"))
    router = Child("router", router_argv(ports, args.host, args.port), _root(args.host, args.port))
    supervisor = Supervisor(
        replicas, router, env=child_env(checkpointer, api_key), out=sys.stderr, prog=prog
    )
    return _run(supervisor, args, checkpointer, api_key is not None)


def _root(host: str, port: int) -> str:
    """Where the supervisor asks the router for /health (an address of this machine)."""
    shown = REPLICA_HOST if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}"


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run(supervisor: Supervisor, args: argparse.Namespace, checkpointer: str, keyed: bool) -> int:
    signals = Signals(supervisor)
    try:
        supervisor.start(first_alone=not (args.base_url or os.environ.get("MUR_BASE_URL")))
        supervisor.say(
            f"{args.replicas} replicas on ports {args.port + 1}-{args.port + args.replicas} "
            f"sharing {parse_target(checkpointer)}; vllm-router on "
            f"http://{args.host}:{args.port}/v1 ({'API key required' if keyed else 'no API key'})"
        )
        if not keyed and not _loopback(args.host):
            supervisor.say(
                f"warning: the router listens on {args.host} without an API key: anyone who "
                f"reaches it can spend the backbone's compute (set {API_KEY_ENV})"
            )
        while not supervisor.stopping:
            supervisor.check()
            time.sleep(0.5)
        grace = args.drain_seconds + CLOSE_MARGIN_S
        return supervisor.drain(grace, lambda: signals.count)
    except ServerError as exc:
        print(f"{supervisor.prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        supervisor.close()
        signals.restore()
