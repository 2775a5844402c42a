"""The flags that say which servers a command uses, shared by every command that talks to one
(`mur solve`, the endpoint, the experiments, the benchmarks): declared once, named as
servers.connect.connect names its arguments, checked before any server is probed, and passed
on to a command another one starts."""

from __future__ import annotations

import argparse
from typing import Any

from mur.servers.clients.errors import ServerError
from mur.servers.clients.probes import check_single_url
from mur.servers.processes.profiles import get_profile

CONNECTION_DEFAULTS = (
    "Unset, each comes from MUR_BASE_URL, MUR_MODEL, MUR_VERIFIER_URL or MUR_VERIFIER_MODEL, "
    "else the embedded CPU server; the verifier is the backbone unless one is named."
)
# The flags of add_connection_arguments, by their argparse dest (connect()'s argument names).
CONNECTION_FLAGS = (
    "base_url",
    "model",
    "verifier_url",
    "verifier_model",
    "profile",
    "verifier_profile",
)


def add_connection_arguments(
    parser: argparse.ArgumentParser, *, verifier: bool = True, defaults: str = CONNECTION_DEFAULTS
) -> argparse._ArgumentGroup:
    """Declare the flags that say which servers a command uses, named as `connect` names its
    arguments: --base-url, --model, --verifier-url, --verifier-model (unless `verifier` is
    false: a command that talks to one server) and --profile. `defaults` says where an unset
    flag's value comes from in this command (the group's description in --help)."""
    group = parser.add_argument_group("servers", defaults)
    group.add_argument(
        "--base-url",
        metavar="URL",
        help="the backbone's OpenAI-compatible server: one vLLM server, or a vllm-router in "
        "front of replicas (`mur servers up --replicas N`)",
    )
    group.add_argument(
        "--model", metavar="NAME", help="the backbone's model name (default: what it serves)"
    )
    if verifier:
        group.add_argument(
            "--verifier-url",
            metavar="URL",
            help="the external model's server or router: the judge of critic and best_of_n, "
            "the writer of the steps escalate hands it",
        )
        group.add_argument(
            "--verifier-model",
            metavar="NAME",
            help="the external model's name (default: what its server serves)",
        )
    group.add_argument(
        "--profile",
        type=profile_name,
        metavar="NAME",
        help="a server profile (`mur servers profiles`) whose recommended graph settings "
        "apply; without --base-url a CPU profile is also the server used here (default: the "
        "embedded server's)",
    )
    if verifier:
        group.add_argument(
            "--verifier-profile",
            type=profile_name,
            metavar="NAME",
            help="a second profile as the external model (judge, critic or escalation "
            "model): without --verifier-url, "
            "that profile's server here (`mur servers up --profile B "
            "--verifier-profile V` starts both)",
        )
    return group


def profile_name(name: str) -> str:
    """argparse type of --profile and --verifier-profile: a known profile's name, else the
    parser's one-line error listing them (`get_profile`'s, the one list of profiles)."""
    try:
        return get_profile(name).name
    except ServerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The connection flags of parsed `args` as `connect`'s keyword arguments."""
    return {name: getattr(args, name, None) for name in CONNECTION_FLAGS}


def check_connection_flags(args: argparse.Namespace) -> None:
    """Refuse connection flags that cannot work, before any server is probed: a model name
    without the server that serves it, a list of URLs (replicas go behind a router). Raises
    ServerError with one line naming the flag."""
    options = connection_options(args)
    if options["model"] and not options["base_url"]:
        raise ServerError("--model needs --base-url")
    for flag in ("base_url", "verifier_url"):
        check_single_url(options[flag], "--" + flag.replace("_", "-"))


def connection_argv(args: argparse.Namespace) -> list[str]:
    """The connection flags that were given, as arguments for another command that takes
    them (a benchmark starting the endpoint, an experiment running run.py)."""
    argv: list[str] = []
    for name, value in connection_options(args).items():
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv
