"""The cascade experiment (experiments/cascade.py): seven folders named by arm decide C1-C4
through `mur report --prereg cascade --live ARM=DIR ...`, and the pilot's thresholds."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from mur.cli.report import main
from mur.evals.harness.records import RecordStore
from mur.evals.harness.run_record import JobKey, RunRecord, make_record
from mur.evals.harness.wall_time import Timed
from mur.experiments import cascade
from mur.graphs.state import Context

QUESTIONS = 20
# Per arm: how many of the 20 questions it answers, its gate, and per question the tokens of
# the 0.5B (backbone) and 1.5B (external), steps and scaled steps.
ARMS: dict[str, tuple[int, str, int, int, int, int]] = {
    "small": (2, "never", 300, 0, 6, 0),
    "large": (8, "never", 600, 0, 9, 0),  # the 1.5B writes alone: its backbone tokens
    "always": (8, "always", 300, 600, 6, 6),
    "mur": (7, "mur", 300, 120, 6, 2),
    "random": (4, "random", 300, 120, 6, 2),
    "smart": (5, "smart", 300, 120, 6, 2),
    "first_token": (7, "first_token", 300, 120, 6, 2),
}


def step(index: int, scaled: bool) -> dict[str, Any]:
    draft = {"text": "d", "uncertainty": 0.5, "num_tokens": 40, "confidence": 0.5 + index / 100,
             "first_token_entropy": 2.0}  # fmt: skip
    return {
        "index": index, "text": "s", "uncertainty": 0.3, "confidence": 0.9 - index / 100,
        "momentum_before": 0.0, "momentum_after": 0.0, "scaled": scaled,
        "strategy": "escalate" if scaled else None, "num_tokens": 50,
        "refine": {"strategy": "escalate", "draft": draft} if scaled else None,
        "first_token_entropy": 2.0 if scaled else 0.1 * index,
    }  # fmt: skip


def arm_records(arm: str) -> list[RunRecord]:
    right, gate, small, large, steps, scaled = ARMS[arm]
    top = {"top_logprobs": 5} if gate == "first_token" else {}
    config = Context(strategy="escalate", gate=gate, **top).as_dict()
    records = []
    for q in range(QUESTIONS):
        output = {
            "answer": "1" if q < right else "2",
            "finish_reason": "answer",
            "steps": [step(i, i <= scaled) for i in range(1, steps + 1)],
            "usage": {
                "backbone_tokens": small,
                "external_tokens": large,
                "backbone_prompt_tokens": 0,
                "external_prompt_tokens": 0,
                "llm_calls": 1,
            },
            "fallback": None,
            "config": config,
        }
        gamma = 0.9 if gate == "mur" else None
        key = JobKey("math500", f"q{q}", "escalate", gate, gamma, 0)
        records.append(make_record(key, "1", output, q < right, 1.0))
    return records


def folders(root: Path, arms: list[str]) -> list[str]:
    flags = []
    for arm in arms:
        store = RecordStore(root / arm)
        for record in arm_records(arm):
            store.append(record)
        flags += ["--live", f"{arm}={root / arm}"]
    return flags


def test_the_seven_arms_decide_c1_to_c4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cascade, "QUESTIONS", QUESTIONS)
    out = tmp_path / "cascade"
    assert main(["--prereg", "cascade", "--out", str(out), *folders(tmp_path, list(ARMS))]) == 0
    assert "Wall time: not measured yet" in (out / "report.md").read_text()
    # `mur bench trace_time --out` into the report's folder: q2 was timed by one arm only.
    runs = [
        asdict(Timed(f"cascade-{arm}", q, wall, 100, 100, 500, 1, 0, [wall]))
        for arm, wall in (("large", 40.0), ("mur", 30.0))
        for q in ("q0", "q1", *("q2",) * (arm == "mur"))
    ]
    runs.append(asdict(Timed("majority@8", "q0", 1.0, 1, 1, 1, 8, 0, [1.0])))
    server = {"vllm_version": "0.32.0", "dtype": "float32", "cpu": "AMD EPYC"}
    wall_time = {"server": server, "verifier": server, "plan": {}, "runs": runs}
    (out / cascade.WALL_TIME_FILE).write_text(json.dumps(wall_time))
    assert (
        main(["--prereg", "cascade", "--out", str(out), *folders(tmp_path / "again", list(ARMS))])
        == 0
    )
    report = (out / "report.md").read_text()
    assert (
        "each arm on the 2 questions every timed arm shares (vLLM 0.32.0, float32 on AMD EPYC and"
        in report
    )
    assert "| large | 40.0 | 40.0 | 100 | 1.00x |" in report
    assert "| mur | 30.0 | 30.0 | 100 | 0.75x |" in report and "majority@8" not in report
    decisions = {h["name"]: h for h in json.loads((out / "report.json").read_text())["hypotheses"]}
    assert decisions["C1"]["value"] == pytest.approx((7 - 2) / QUESTIONS)
    assert decisions["C2"]["value"] == pytest.approx((7 - 8) / QUESTIONS)
    assert "1.5B tokens 0.20x" in decisions["C2"]["detail"]  # 120 of the 1.5B's own 600
    assert decisions["C3"]["value"] == pytest.approx(3 / QUESTIONS)
    assert decisions["C4 first_token"]["value"] == 0.0
    assert decisions["C4 first_token"]["supported"] is False
    report = (out / "report.md").read_text()
    assert "| mur | 35.0% | 300 | 120 | " in report
    # A first-token probe would have skipped each escalated draft but its first token.
    assert "| mur | 35.0% | 300 | 120 | 667 | 33.3% | 342 |" in report


def test_an_arm_short_of_its_questions_leaves_its_tests_pending(tmp_path: Path) -> None:
    out = tmp_path / "cascade"
    flags = folders(tmp_path, ["mur", "small"])
    assert main(["--prereg", "cascade", "--out", str(out), *flags]) == 0
    decisions = {h["name"]: h for h in json.loads((out / "report.json").read_text())["hypotheses"]}
    assert decisions["C1"]["supported"] is None
    assert "arm mur has 20 and small has 20 of 400 questions" in decisions["C1"]["detail"]
    assert "no folder given as --live large=DIR" in decisions["C2"]["detail"]


def test_a_folder_under_the_wrong_arm_name_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = folders(tmp_path, ["mur", "random"])
    swapped = ["--live", f"mur={tmp_path / 'random'}", "--live", f"random={tmp_path / 'mur'}"]
    assert main(["--prereg", "cascade", "--out", str(tmp_path / "c"), *swapped]) == 2
    err = capsys.readouterr().err
    assert "ran gate='random'; results/prereg-cascade.md's arm 'mur' runs gate='mur'" in err
    assert flags  # the right names decide (the test above)


def test_the_pilot_sets_smart_and_first_token_at_murs_rate() -> None:
    thresholds = cascade.pilot_thresholds(arm_records("mur"))
    assert thresholds.rate == pytest.approx(2 / 6)
    # A third of the drafts (the two escalated ones of each question) lie past each threshold.
    assert 0.52 < thresholds.tau < 0.88
    assert 0.6 <= thresholds.first_token_threshold < 2.0


def test_the_timed_arms_are_the_main_runs_settings() -> None:
    """`mur bench trace_time --arms cascade-...` times what the committed main run ran: the
    pilot's choices as the mur arm's records and settings carry them, and the thresholds the
    pilot's own records give smart and first_token (rounded as the pre-registration's
    commands give them)."""
    root = Path(__file__).resolve().parents[2]
    folder = root / "results" / "cascade-mur"
    settings = json.loads((folder / "settings.json").read_text())
    record = next(iter(RecordStore(folder).load()))
    mur = cascade.TIMED_ARMS["mur"]
    assert (
        (mur["strategy"], mur["gate"])
        == (record["strategy"], record["gate"])
        == (
            "escalate",
            "mur",
        )
    )
    assert mur["gamma"] == record["gamma"]
    assert mur["escalate_momentum"] == settings["escalate_momentum"]
    pilot = cascade.pilot_thresholds(list(RecordStore(root / "results/pilot-cascade-draft").load()))
    assert cascade.PILOT_CHOICES["tau"] == round(pilot.tau, 4)
    assert cascade.PILOT_CHOICES["first_token_threshold"] == round(pilot.first_token_threshold, 4)
    assert cascade.TIMED_ARMS["large"][cascade.WRITER] == "verifier"
    assert all(
        cascade.WRITER not in arm for name, arm in cascade.TIMED_ARMS.items() if name != "large"
    )
