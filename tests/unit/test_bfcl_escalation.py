"""The BFCL experiment (experiments/bfcl_escalation.py): four folders named by arm decide B1-B2
through `mur report --prereg bfcl --live ARM=DIR ...`, and the pilot's rules choose the
categories and gamma."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mur.cli.report import main
from mur.evals.harness.records import RecordStore
from mur.evals.harness.run_record import JobKey, RunRecord
from mur.experiments import bfcl_escalation as experiment
from mur.experiments.bfcl import Case, CaseRun, case_record

CASES = 10
# Per arm: how many of the 10 cases are valid, its gate, the tokens of the 0.5B and the 1.5B,
# and which of its 5 calls were escalated.
ARMS: dict[str, tuple[int, str, int, int, tuple[int, ...]]] = {
    "small": (2, "never", 200, 0, ()),
    "always": (7, "always", 200, 300, (1, 2, 3, 4, 5)),
    "mur": (6, "mur", 200, 120, (3, 5)),
    "random": (3, "random", 200, 120, (2, 4)),
}


def call(number: int, uncertainty: float, action: str, small: int, large: int) -> dict[str, Any]:
    """A middleware record of one model call (integrations.middleware), its calls' tokens."""
    calls = [{"role": "draft", "model": "0.5b", "uncertainty": uncertainty,
              "input_tokens": 1000, "output_tokens": small}]  # fmt: skip
    if action == "escalated":
        calls.append({"role": "escalation", "model": "1.5b", "uncertainty": None,
                      "input_tokens": 1000, "output_tokens": large})  # fmt: skip
    return {"call": number, "uncertainty": uncertainty, "action": action, "calls": calls}


def records(gate: str, valid: int, small: int, large: int, escalated: tuple[int, ...],
            uncertainties: tuple[float, ...] = (0.1, 0.1, 0.5, 0.1, 0.6),
            category: str = "multi_turn_base") -> list[RunRecord]:  # fmt: skip
    made = []
    for number in range(CASES):
        case = Case({"id": f"{category}_{number}"}, [["cd(folder='a')"]])
        run = CaseRun(
            turns=[[["cd(folder='a')"]]] if number < valid else [[]],
            calls=[
                call(
                    i,
                    u,
                    "escalated" if i in escalated else "kept",
                    small // 5,
                    large // max(len(escalated), 1),
                )
                for i, u in enumerate(uncertainties, start=1)
            ],
        )
        key = JobKey("bfcl", case.id, "escalate", gate, 0.9 if gate == "mur" else None, 0)
        record = case_record(key, case, run, 1.0, {"gate": gate})
        record["correct"] = number < valid  # BFCL's checker needs the real case: decided here
        made.append(record)
    return made


def folders(root: Path, arms: list[str]) -> list[str]:
    flags = []
    for arm in arms:
        valid, gate, small, large, escalated = ARMS[arm]
        store = RecordStore(root / arm)
        for record in records(gate, valid, small, large, escalated):
            store.append(record)
        flags += ["--live", f"{arm}={root / arm}"]
    return flags


@pytest.fixture(autouse=True)
def _checked_without_bfcl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mur.experiments.bfcl.check", lambda case, run: (bool(run.turns[0]), ""))


def test_the_four_arms_decide_b1_and_b2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiment, "CASES_PER_CATEGORY", CASES)
    out = tmp_path / "bfcl"
    assert main(["--prereg", "bfcl", "--out", str(out), *folders(tmp_path, list(ARMS))]) == 0
    decisions = {h["name"]: h for h in json.loads((out / "report.json").read_text())["hypotheses"]}
    assert decisions["B1"]["value"] == pytest.approx((6 - 2) / CASES)
    assert decisions["B2"]["value"] == pytest.approx((6 - 3) / CASES)
    assert decisions["B1"]["detail"] == "10 cases; escalated calls 0.400 / 0.000"
    report = (out / "report.md").read_text()
    assert "| mur | 60.0% | 200 | 120 | 5.0 | 40.0% |" in report
    assert "| always | 70.0% | 200 | 300 | 5.0 | 100.0% |" in report


def test_an_arm_short_of_its_cases_leaves_its_test_pending(tmp_path: Path) -> None:
    out = tmp_path / "bfcl"
    assert main(["--prereg", "bfcl", "--out", str(out), *folders(tmp_path, ["mur", "small"])]) == 0
    decisions = {h["name"]: h for h in json.loads((out / "report.json").read_text())["hypotheses"]}
    assert decisions["B1"]["supported"] is None
    assert "arm mur has 10 and small has 10 of 100 cases" in decisions["B1"]["detail"]
    assert "no --live random=DIR" in decisions["B2"]["detail"]


def test_a_folder_under_the_wrong_arm_name_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders(tmp_path, ["mur", "random"])
    swapped = ["--live", f"mur={tmp_path / 'random'}", "--live", f"random={tmp_path / 'mur'}"]
    assert main(["--prereg", "bfcl", "--out", str(tmp_path / "b"), *swapped]) == 2
    assert "ran gate='random'; results/prereg-bfcl.md's arm 'mur' runs gate='mur'" in (
        capsys.readouterr().err
    )


def test_the_pilot_keeps_the_categories_with_a_gap_and_the_gamma_nearest_the_rate() -> None:
    # Calls 3 and 5 stand far out from the momentum; call 2 and 4 only for a gamma near 1.
    small = {
        "multi_turn_base": records("never", 2, 200, 0, ()),
        "multi_turn_miss_param": records("never", 2, 200, 0, (), category="multi_turn_miss_param"),
    }
    large = {
        "multi_turn_base": records("never", 3, 200, 0, ()),  # +10 points: enters
        "multi_turn_miss_param": records("never", 2, 200, 0, ()),  # no gap
    }
    chosen = experiment.pilot_choices(small, large)
    assert chosen.gaps == pytest.approx({"multi_turn_base": 0.1, "multi_turn_miss_param": 0.0})
    assert chosen.categories == ["multi_turn_base"]
    rates = [chosen.rates[gamma] for gamma in experiment.GAMMAS]
    assert rates[0] == pytest.approx(0.4) and rates == sorted(rates) and rates[-1] > 0.4
    assert chosen.gamma == 0.9  # 40% is the nearest to 30%
    flat = {"multi_turn_base": records("never", 2, 200, 0, (), uncertainties=(0.1,) * 5)}
    assert experiment.pilot_choices(flat, flat).categories == []
    assert experiment.pilot_choices(flat, flat).gamma is None
