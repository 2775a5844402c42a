"""`mur bench chaos` in miniature: every phase, 8 clients for a few seconds each, a replica
SIGKILLed, a replica SIGSTOPped for 2.5 leases, PostgreSQL SIGSTOPped for 4 s, a fault every
4-6 s with a 2 s lease, over the tests' scripted backbone and a PostgreSQL the benchmark starts
itself. Nothing may be lost, answered twice differently, wrong, written after a takeover or
orphaned, and the table must show the faults and what they cost.
"""

from __future__ import annotations

import os
import re

import pytest

from mur.benchmarks.chaos import HEADER, REPLICAS, port_free
from mur.cli.bench.chaos import main
from mur.servers.processes.postgres import PostgresMissing, binaries
from postgres import free_port


def free_ports() -> int:
    """A port with the next REPLICAS free as well (the router's and its replicas')."""
    while True:
        port = free_port()
        if all(port_free(port + i) for i in range(1, REPLICAS + 1)):
            return port


def table_rows(out: str) -> dict[str, dict[str, str]]:
    """The markdown table's rows by phase, each cell by its column's title."""
    titles = [cell.strip() for cell in HEADER.strip("|").split("|")]
    rows = {}
    for line in out.splitlines():
        if re.match(r"\| (baseline|kills|freezes|db-freezes) \|", line):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0]] = dict(zip(titles, cells, strict=True))
    return rows


@pytest.mark.chaos
@pytest.mark.timeout(420)
def test_a_short_chaos_run_loses_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        binaries()
    except PostgresMissing as exc:  # as the `postgres` fixture does (tests/conftest.py)
        if os.environ.get("MUR_TEST_REQUIRE_POSTGRES", "") == "1":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    argv = ["--seconds", "12", "--clients", "8", "--kill-every", "4:6", "--lease-seconds", "2"]
    argv += ["--db-pause", "4"]
    status = main([*argv, "--port", str(free_ports())])
    said = capsys.readouterr()
    assert status == 0, said.out + said.err  # why it failed is on stderr
    rows = table_rows(said.out)
    assert set(rows) == {"baseline", "kills", "freezes", "db-freezes"}
    for row in rows.values():
        assert row["lost"] == row["answered twice, differently"] == row["wrong answers"] == "0"
        assert row["written after a takeover"] == row["orphans"] == "0"
        assert int(row["requests finished"]) > 0
    # One run's calls per question (CALLS_PER_RUN) hold: undisturbed, nothing is recomputed.
    baseline = rows["baseline"]
    assert baseline["faults"] == baseline["model calls recomputed"] == "0"
    assert all(int(rows[name]["faults"]) >= 1 for name in ("kills", "freezes", "db-freezes"))
    assert int(rows["kills"]["runs resumed"]) >= 1
