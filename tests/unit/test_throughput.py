"""Questions in flight are chosen by measuring the server; a measurement taken while the server,
or a server beside it on the same cores, worked for other clients is used once and not kept."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from faulty_server import in_thread
from mur.evals.harness.provenance import FALLBACK_CONCURRENCY, ROLES, choose_concurrency, same_host
from mur.servers.processes.facts import ServerFacts
from mur.servers.processes.throughput import PROBE_TOKENS, STREAMS, measured_rates

METRIC = "vllm:generation_tokens_total"


class WideServer(ThreadingHTTPServer):
    request_queue_size = 128  # the probe opens 64 connections at once


class CountingServer:
    """Answers /v1/completions with `max_tokens` tokens and counts them in /metrics, as
    vLLM's generation counter does; `others` tokens more appear at each /metrics read (the
    work of another client)."""

    def __init__(self, others: int = 0) -> None:
        self.generated = self.completions = 0
        self.others, self.lock = others, threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def _send(self, body: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                with server.lock:
                    server.generated += server.others
                    text = f'{METRIC}{{model_name="m"}} {server.generated}\n'
                self._send(text.encode(), "text/plain")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.generated += body["max_tokens"]
                    server.completions += 1
                reply = {"usage": {"completion_tokens": body["max_tokens"]}}
                self._send(json.dumps(reply).encode(), "application/json")

        self.httpd = WideServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@contextmanager
def serving(others: int = 0) -> Iterator[CountingServer]:
    server = CountingServer(others)
    with in_thread(server.httpd):
        yield server


def facts_of(server: CountingServer) -> ServerFacts:
    return ServerFacts(
        server.base_url, "m", "0.32.0", "bfloat16", "bf16", "raw_logprobs", "CPU", ()
    )


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MUR_HOME", str(tmp_path))
    return tmp_path


def test_a_quiet_measurement_is_kept_and_not_taken_again(home: Path) -> None:
    with serving() as server, serving() as beside:
        rates = measured_rates(facts_of(server), beside=[beside.base_url])
        asked = server.completions
        again = measured_rates(facts_of(server), beside=[beside.base_url])
    # What each rate comes to is this machine's; what was asked for each is not.
    assert [r.streams for r in rates] == list(STREAMS)
    assert asked == 1 + 2 * sum(STREAMS)  # a warm-up, then each width up and down again
    assert server.generated == asked * PROBE_TOKENS
    assert again == rates and server.completions == asked  # read from disk, not measured
    assert server.base_url in (home / "throughput.json").read_text()


@pytest.mark.parametrize("busy", ["server", "beside"])
def test_a_measurement_taken_while_others_generate_is_used_once_and_not_kept(
    busy: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        serving(others=7 if busy == "server" else 0) as server,
        serving(others=7 if busy == "beside" else 0) as beside,
    ):
        rates = measured_rates(facts_of(server), beside=[beside.base_url])
        asked = server.completions
        measured_rates(facts_of(server), beside=[beside.base_url])
        assert server.completions == 2 * asked  # nothing was kept: measured again
    busy_url = server.base_url if busy == "server" else beside.base_url
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0] == (
        f"throughput of {server.base_url} measured while {busy_url} generated 7 tokens for "
        f"other clients: used for this run, not kept in {home / 'throughput.json'}"
    )
    assert len(rates) == len(STREAMS)
    assert not (home / "throughput.json").exists()


def test_only_servers_on_the_same_host_count_as_beside() -> None:
    urls = ["http://127.0.0.1:8021/v1", "http://127.0.0.1:8022/v1", "http://gpu-box:8001/v1"]
    assert same_host(urls[0], urls) == [urls[1]]
    assert same_host(urls[2], urls) == []


@pytest.mark.parametrize("asked", [ROLES, ("backbone",)])
def test_only_the_servers_a_strategy_asks_are_measured(asked: tuple[str, ...]) -> None:
    """Foresight and thinking never ask the verifier: its server's speed must not bound the
    questions in flight (nor cost a probe); the backbone's alone chooses them."""
    with serving() as backbone, serving() as verifier:
        facts = {"backbone": facts_of(backbone), "verifier": facts_of(verifier)}
        concurrency, rates = choose_concurrency(facts, asked=asked)
    assert list(rates) == list(asked) and concurrency in STREAMS
    assert verifier.completions == (0 if asked == ("backbone",) else 1 + 2 * sum(STREAMS))


def test_no_asked_server_to_measure_keeps_the_default() -> None:
    """A backbone that is a test double and a real verifier the strategy never asks: nothing
    to measure, so the default, and the verifier is left alone."""
    with serving() as verifier:
        chosen = choose_concurrency({"verifier": facts_of(verifier)}, asked=("backbone",))
    assert chosen == (FALLBACK_CONCURRENCY, {}) and verifier.completions == 0
