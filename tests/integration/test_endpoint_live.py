"""The MUR endpoint over the real CPU vLLM server: a client that disconnects mid-stream stops
the server's generation within one step. (Whole completions, streamed and not, with their
tokens checked against the server's counter: test_endpoint_load_live.py.)

Kept to small requests: the server is shared and slow (2 CPU cores). The token checks compare
with the server's own counter, so run these under the integration lock (no other client).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_counters import settled

from asgi_server import running
from mur.endpoint import create_app
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.metrics import generation_tokens, read_counter
from mur.servers.processes.launcher import RunningServer

pytestmark = pytest.mark.integration

SMALL = {"max_steps": 2, "max_step_tokens": 48, "judge_max_tokens": 32}


# One number per step: the small model keeps writing steps of a few tokens each, so a run that
# is not cancelled goes on generating for about a minute.
ENDLESS = "Count from 1 to 100, writing one number per step. Do not stop early."
STEP_TOKENS = 32


def test_disconnect_mid_stream_stops_the_server_within_one_step(
    cpu_server: RunningServer,
) -> None:
    app = create_app(make_chat_model(cpu_server.base_url, cpu_server.model))
    body = {
        "model": "mur-critic-never",
        "messages": [{"role": "user", "content": ENDLESS}],
        "stream": True,
        "mur": {"max_steps": 40, "max_step_tokens": STEP_TOKENS},
    }
    counter = lambda: generation_tokens(cpu_server.base_url)  # noqa: E731
    with running(app) as url, httpx.Client(timeout=300) as client:
        with client.stream("POST", f"{url}/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            events = (line for line in reply.iter_lines() if line.startswith("data: "))
            steps = [json.loads(next(events).removeprefix("data: ")) for _ in range(2)]
        at_disconnect = counter()
        assert [s["mur_step"]["index"] for s in steps] == [1, 2]
        # The run is cancelled at once; its request in flight, if any, is aborted by vLLM.
        deadline = time.monotonic() + 10
        while app.state.service.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.service.in_flight == 0, "the graph run goes on after the disconnect"
        after = settled(counter, quiet=3, timeout=60)
    grown = after - at_disconnect
    assert grown <= STEP_TOKENS, f"the server generated {grown} tokens after the disconnect"
    running_now = read_counter(cpu_server.base_url, "vllm:num_requests_running")
    assert running_now == 0
