"""Shared test fixtures.

`cpu_server` (session scope) gives integration tests one real vLLM CPU server (profile
cpu-tiny, the embedded SmolLM2-135M model): it reuses a healthy server already running on the
profile's port, otherwise starts one (eager, ~50 s; set MUR_TEST_COMPILED=1 for the compiled
build, ~2 min) and stops it at the end of the session only if it started it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from servers.errors import ServerError
from servers.launcher import RunningServer, down, up
from servers.metrics import generation_tokens


@pytest.fixture(scope="session")
def cpu_server() -> Iterator[RunningServer]:
    """The cpu-tiny vLLM server, healthy, for the whole test session."""
    eager = os.environ.get("MUR_TEST_COMPILED", "") != "1"
    timeout = float(os.environ.get("MUR_TEST_SERVER_TIMEOUT", "900"))
    try:
        server = up("cpu-tiny", eager=eager, timeout=timeout, progress=True)
    except ServerError as exc:
        pytest.fail(f"integration tests need the cpu-tiny vLLM server: {exc}", pytrace=False)
    yield server
    if server.started:
        down(server.profile)


@pytest.fixture
def generated_tokens(cpu_server: RunningServer) -> Callable[[], int]:
    """Tokens the server generated since this fixture was set up (`vllm:generation_tokens_total`).

    An external check of client-side token accounting; counts every client of the server.
    """
    start = generation_tokens(cpu_server.base_url)
    return lambda: generation_tokens(cpu_server.base_url) - start
