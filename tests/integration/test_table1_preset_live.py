"""`experiments.table1 --preset paper-gpu`'s first question on the tiny random-weight Qwen3
(tests/tiny_qwen3.py; the session's `tiny_qwen3` server), which stands in for both Qwen3-1.7B
and GenPRM-1.5B: the preset's first command, run as the table runs it (the `mur solve`
command), records every gate of the paper's table with the preset's settings. The model writes
garbage; what is checked is the plumbing."""

from __future__ import annotations

import json

import pytest

from mur.cli.experiment.table1 import build_parser, make_plan
from mur.evals.harness.records import load_records
from mur.evals.questions import load_dataset
from mur.experiments.table1 import run_mur
from mur.nodes.gate_labels import STANDARD_LABELS
from tiny_qwen3 import SERVED_NAME, TinyQwen3Server

pytestmark = pytest.mark.integration

# Small caps: each of the six runs takes seconds on two cores.
CAPS = ["--max-steps", "2", "--max-step-tokens", "8", "--judge-max-tokens", "8"]


def test_the_paper_presets_first_question_gives_a_record_per_gate(
    tiny_qwen3: TinyQwen3Server, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MUR_BASE_URL", raising=False)
    url = tiny_qwen3.base_url
    args = build_parser().parse_args(
        ["--preset", "paper-gpu", "--limit", "1", "--concurrency", "1",
         "--base-url", url, "--verifier-url", url, "--results", str(tmp_path)]
    )  # fmt: skip
    plan = make_plan(args, CAPS)
    first = plan.phases()[0]
    assert (first.dataset.name, first.strategy, first.dataset.gamma) == ("math500", "critic", 0.9)
    assert (first.dataset.limit, first.dataset.samples) == (1, 1)

    assert run_mur(plan.argv(first)) == 0

    records = load_records(first.folder)
    (question,) = load_dataset("math500", limit=1)
    assert sorted(r["gate"] for r in records) == sorted(STANDARD_LABELS)
    for record in records:
        assert (record["dataset"], record["problem_id"]) == ("math500", question.id)
        assert (record["strategy"], record["sample"]) == ("critic", 0)
        assert record["gamma"] == (0.9 if record["gate"] in ("mur", "mur+bc") else None)
        assert record["steps_total"] >= 1 and record["usage"]["backbone_tokens"] > 0
    assert plan.progress(first) == (len(STANDARD_LABELS), len(STANDARD_LABELS))
    # The preset's settings reached mur (the thinking switch's, the qwen3-1.7b profile's), the
    # user's caps came after them, and the external model is the server named for it.
    settings = json.loads((first.folder / "settings.json").read_text())
    assert settings["thinking_budget"] == 2048 and settings["thinking_style"] == "qwen3"
    assert settings["max_steps"] == 2 and settings["judge_max_tokens"] == 8
    assert settings["backbone_model"] == settings["verifier_model"] == SERVED_NAME
    always = next(r for r in records if r["gate"] == "always")
    assert always["steps_scaled"] >= 1
    assert always["usage"]["external_tokens"] > 0
