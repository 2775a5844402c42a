"""`mur bench formats`: the table it prints (the serving itself is timed on a quiet machine,
BENCHMARKS.md), and its refusal to time beside other servers."""

from __future__ import annotations

import pytest

from mur.benchmarks import formats
from mur.benchmarks.formats import FormatRun, reason, table
from mur.cli.bench.formats import main
from mur.servers.clients.errors import ModelError
from mur.servers.processes.launcher import RunningServer


def test_the_table_gives_rates_waits_and_ratios_and_says_which_format_does_not_serve() -> None:
    bf16 = FormatRun("bf16", rates={1: 7.0, 8: 40.0, 32: 80.0}, alone_s=[60.0, 40.0],
                     alone_tokens=[500, 300])  # fmt: skip
    int8 = FormatRun("w8a8", rates={1: 10.5, 8: 60.0, 32: 120.0}, alone_s=[50.0],
                     alone_tokens=[520])  # fmt: skip
    int4 = FormatRun("w4a16", failed="no kernel")
    lines = table([bf16, int8, int4]).splitlines()
    assert lines[2] == "| bf16 | 7.0 | 40.0 | 80.0 | 50.0 | 400 | 8.0 | 1.00x / 1.00x / 1.00x |"
    assert lines[3] == "| w8a8 | 10.5 | 60.0 | 120.0 | 50.0 | 520 | 10.4 | 1.50x / 1.50x / 1.50x |"
    assert lines[4] == "| w4a16 | does not serve here: no kernel |"


def test_it_refuses_to_time_beside_another_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    running = RunningServer("cpu-qwen-1.5b", "http://127.0.0.1:8022/v1", "m", 1, True, False, None)
    monkeypatch.setattr(formats, "status", lambda: [running])
    monkeypatch.setattr(formats, "measure", lambda *a: pytest.fail("measured beside a server"))
    assert main(["--formats", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "cpu-qwen-1.5b (http://127.0.0.1:8022/v1)" in err and "mur servers down --all" in err


def test_a_failure_fits_one_cell_with_its_cause() -> None:
    failed = ModelError(
        "quantizing X to w4a16 failed (exit 1):\nTraceback\n  ...\nboom: 576 columns\n"
    )
    assert reason(failed) == "quantizing X to w4a16 failed (exit 1): ... boom: 576 columns"
    assert reason(ModelError("one line")) == "one line"
