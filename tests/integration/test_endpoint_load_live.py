"""The bounded load test of the endpoint over the real CPU vLLM server, as CI runs it:
`mur endpoint` in its own process, 16 concurrent clients, streaming and not. Every reply
complete and consistent, none duplicated, no 5xx, and the tokens the replies report equal to
what the server's counter says it generated (run under the integration lock)."""

from __future__ import annotations

import socket

import pytest

from mur.benchmarks.endpoint_load import run
from mur.cli.bench.endpoint_load import build_parser
from mur.cli.connection import connection_argv
from mur.servers.processes.launcher import RunningServer

pytestmark = pytest.mark.integration


def test_16_clients_over_the_cpu_server(cpu_server: RunningServer) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flags = ["--backbone", "cpu", "--base-url", cpu_server.base_url, "--port", str(port)]
    args = build_parser().parse_args([*flags, "--clients", "16", "--requests", "32"])
    report = run(args, connection_argv(args))
    assert report.requests == report.ok == 32 and report.streamed == 16
    assert (report.lost, report.duplicated, report.unexpected_5xx, report.wrong) == (0, 0, 0, 0)
    assert report.server_tokens == report.reply_tokens > 0, report.problems
