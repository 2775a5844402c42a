"""Two results folders side by side, paired on the questions both ran."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_report import record, write_records

from mur.evals.report.compare import compare, main, to_markdown


def test_each_shared_setting_is_paired_on_common_questions_only() -> None:
    a = [
        record(1, "always", False, external=300),
        record(2, "always", True, external=300),
        record(3, "always", True, external=300),  # only in A: left out
        record(1, "never", True),  # never is only in A: no row
    ]
    b = [
        record(1, "always", True, external=100),
        record(2, "always", True, external=100),
        record(1, "mur", True, gamma=0.9),  # only in B: no row
    ]
    (row,) = compare(a, b, resamples=200)
    assert row.key == ("math500", "critic", "always", None)
    pairing = row.pairing
    assert pairing.n == 2
    assert (pairing.reference_accuracy, pairing.accuracy) == (0.5, 1.0)
    assert pairing.comparison.difference == pytest.approx(0.5)
    assert pairing.comparison.better == 1
    assert (pairing.reference_tokens, pairing.tokens) == (400, 200)
    table = to_markdown([row], "A", "B")
    assert "| math500 critic always | 2 | 50.0 | 100.0 | +50.0 [+0.0, +100.0] | 1.00 |" in table
    assert "| 400 | 200 | 0.50x |" in table


def test_the_cli_prints_the_table_and_says_when_nothing_is_shared(tmp_path: Path, capsys) -> None:
    a = write_records(tmp_path / "a", [record(1, "never", True), record(1, "always", True)])
    b = write_records(tmp_path / "b", [record(1, "always", False)])
    out = tmp_path / "compare.md"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert "| math500 critic always | 1 |" in capsys.readouterr().out
    assert "math500 critic always" in out.read_text()
    c = write_records(tmp_path / "c", [record(2, "always", True)])
    assert main([str(a), str(c)]) == 1
    assert "share no setting" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "missing")]) == 2
    assert "no records.jsonl" in capsys.readouterr().err
