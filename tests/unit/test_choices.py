"""MUR's settings against the default (`mur`, gamma 0.9): the numbers bias correction and gamma
are chosen by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import record, write_records

from mur.evals.report.choices import mur_choices
from mur.evals.report.tables import write_report


def sweep_records() -> list[dict]:
    """Four questions. The default (mur 0.9) solves q0-q2 at 300 tokens; mur+bc 0.9 solves q0
    only at 150; mur 0.7 solves all four at 600 but ran q0-q2 only; always and never are not
    MUR settings."""
    records = [record(q, "mur", q < 3, gamma=0.9, backbone=300, steps=4, scaled=2)
               for q in range(4)]  # fmt: skip
    records += [record(q, "mur+bc", q == 0, gamma=0.9, backbone=150, steps=4, scaled=1)
                for q in range(4)]  # fmt: skip
    records += [record(q, "mur", True, gamma=0.7, backbone=600, steps=4, scaled=4)
                for q in range(3)]  # fmt: skip
    records += [record(q, gate, True) for q in range(4) for gate in ("always", "never")]
    return records


def test_each_mur_setting_is_paired_with_the_default_on_common_questions() -> None:
    choices = {(c.gate, c.gamma): c for c in mur_choices(sweep_records(), 0.9, resamples=500)}
    assert set(choices) == {("mur+bc", 0.9), ("mur", 0.7)}  # not the default against itself

    bc = choices[("mur+bc", 0.9)].pairing
    assert bc.n == 4
    assert (bc.accuracy, bc.reference_accuracy) == (0.25, 0.75)
    assert bc.comparison.difference == pytest.approx(-0.5)
    assert (bc.comparison.better, bc.comparison.worse) == (0, 2)
    assert bc.tokens_ratio == pytest.approx(0.5)
    assert choices[("mur+bc", 0.9)].scaled_share == pytest.approx(0.25)

    low = choices[("mur", 0.7)].pairing
    assert low.n == 3  # q3 has no mur 0.7 run
    assert (low.accuracy, low.reference_accuracy) == (1.0, 1.0)
    assert low.comparison.difference == 0.0 and low.comparison.p_value == 1.0
    assert (low.tokens, low.reference_tokens) == (600, 300)


def test_no_default_means_no_choices() -> None:
    records = [record(q, "mur", True, gamma=0.7) for q in range(3)]
    records += [record(q, "mur+bc", True, gamma=0.9) for q in range(3)]
    assert mur_choices(records, 0.9) == []
    assert [c.gate for c in mur_choices(records, 0.7, resamples=100)] == ["mur+bc"]


def test_the_report_has_the_choices_section_and_json(tmp_path: Path) -> None:
    report = write_report(write_records(tmp_path, sweep_records()), resamples=500)
    assert "## MUR's settings against the default (`mur`, gamma 0.9)" in report.markdown
    assert (
        "| math500 / critic | mur+bc | 0.9 | 4 | 25.0 | 75.0 | -50.0 [-100.0, +0.0] | 0 / 2 "
        "| 0.500 | 150 | 300 | 0.50x | 25.0 |" in report.markdown
    )
    document = json.loads(report.json_path.read_text())
    gates = [(c["gate"], c["gamma"]) for c in document["mur_choices"]]
    assert gates == [("mur", 0.7), ("mur+bc", 0.9)]
    assert document["mur_choices"][1]["pairing"]["tokens_ratio"] == pytest.approx(0.5)


def test_a_report_without_the_default_has_no_choices_section(tmp_path: Path) -> None:
    records = [record(q, g, True) for q in range(2) for g in ("always", "never")]
    report = write_report(write_records(tmp_path, records), resamples=100)
    assert report.choices == [] and "against the default" not in report.markdown
