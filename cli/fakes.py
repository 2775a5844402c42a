"""The command lines of the fakes (testing/) that the load suites start as processes of their own.

    python -m mur.cli.fakes vllm [--port 8061] [--steps 8]
    python -m mur.cli.fakes endpoint [--port 8051] [--max-runs 64] [--checkpointer TARGET]
        [--call-delay 0] [--lease-seconds 30] [--calls-log PATH]

`vllm` is the instant vLLM-shaped server `mur bench client` measures the client against
(testing/fake_vllm.py); `endpoint` is the MUR endpoint over the scripted backbone that `mur bench
endpoint_load` and `mur bench chaos` load (testing/fake_endpoint.py). A command starts them,
never a user, so they are no `mur` subcommand. Only the named fake's arguments are built and
its modules imported: the endpoint's many modules would slow the fake vLLM server's start and
take memory beside the client it measures.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

import uvicorn

from mur.cli.args import OneLineParser, port_number, port_or_any
from mur.testing.fake_vllm import FakeVLLM

PROG = "python -m mur.cli.fakes"
VLLM, ENDPOINT = "vllm", "endpoint"


def build_parser(prog: str = PROG, fake: str | None = None) -> argparse.ArgumentParser:
    """Both fakes as subcommands, with the arguments of `fake` only (None: of both)."""
    parser = OneLineParser(
        prog=prog, description="Serve a fake that a load suite starts as a process of its own."
    )
    sub = parser.add_subparsers(dest="fake", required=True)
    vllm = sub.add_parser(
        VLLM, help="instant vLLM-shaped replies", description="Serve instant vLLM-shaped replies."
    )
    endpoint = sub.add_parser(
        ENDPOINT,
        help="the MUR endpoint over the scripted backbone",
        description="Serve the MUR endpoint over the scripted load-test backbone.",
    )
    if fake in (VLLM, None):
        add_vllm_arguments(vllm)
    if fake in (ENDPOINT, None):
        add_endpoint_arguments(endpoint)
    return parser


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_or_any, default=8061, help="0: any free port")
    parser.add_argument("--steps", type=int, default=8, help="steps of every solution")


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    # The endpoint's modules only for the fake endpoint (this module's docstring).
    from mur.endpoint.checkpointing import CHECKPOINTER_ENV  # noqa: PLC0415
    from mur.endpoint.runs import DEFAULT_LEASE_SECONDS  # noqa: PLC0415
    from mur.persistence.checkpointers import MEMORY  # noqa: PLC0415

    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8051)
    parser.add_argument("--max-runs", type=int, default=64)
    parser.add_argument(
        "--checkpointer", default=os.environ.get(CHECKPOINTER_ENV) or MEMORY, metavar="TARGET"
    )
    parser.add_argument("--call-delay", type=float, default=0.0, metavar="S")
    parser.add_argument("--lease-seconds", type=float, default=DEFAULT_LEASE_SECONDS)
    parser.add_argument("--calls-log", metavar="PATH")


def serve_vllm(args: argparse.Namespace) -> None:
    """Serve; the port it listens on is the first line it prints (`--port 0`: one the system
    picks, so no other process can take it between a choice and the bind)."""
    listening = socket.create_server((args.host, args.port))
    print(listening.getsockname()[1], flush=True)
    config = uvicorn.Config(
        FakeVLLM(steps=args.steps), log_level="warning", access_log=False, lifespan="on"
    )
    uvicorn.Server(config).run(sockets=[listening])


def serve_endpoint(args: argparse.Namespace) -> None:
    """Serve the scripted endpoint with the keep-alive `mur endpoint` serves with."""
    from mur.cli.endpoint import KEEP_ALIVE_SECONDS  # noqa: PLC0415  # see add_endpoint_arguments
    from mur.testing.fake_endpoint import make_app  # noqa: PLC0415

    app = make_app(
        args.max_runs,
        checkpointer=args.checkpointer,
        call_delay=args.call_delay,
        lease_seconds=args.lease_seconds,
        calls_log=args.calls_log,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,  # as `mur endpoint` serves
    )


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Serve the fake the first word names until a signal stops it: 0; 2 for bad flags."""
    words = list(sys.argv[1:] if argv is None else argv)
    fake = words[0] if words and words[0] in (VLLM, ENDPOINT) else ""
    args = build_parser(prog, fake).parse_args(words)
    serve = serve_vllm if args.fake == VLLM else serve_endpoint
    serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
