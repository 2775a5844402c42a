"""The trace analysis of a folder of independent traces (evals.report with several samples of
one setting): H4-H7, accuracy against k, the AUROC table, the replayed rules, and the online
check of a live run against the recorded traces."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_traces import QUESTION, Traces

from fakes import FakeLogprobChat
from mur.cli.report import main
from mur.evals.harness.records import RecordStore, load_records
from mur.evals.harness.run_record import JobKey, RunRecord, make_record
from mur.evals.report.tables import write_report
from mur.evals.report.traces import majority_at, question_traces, within_question_auroc
from mur.experiments import parallel_traces
from mur.experiments.registry import EXPERIMENTS
from mur.graphs.mur import build_graph
from mur.graphs.state import Context

QUESTIONS = 12
SAMPLES = 4


def plan(question: int, sample: int) -> tuple[list[float], str]:
    """Right answers ("1") are surer than wrong ones; question q has q % 4 wrong traces."""
    wrong = sample < question % SAMPLES
    return ([1.5, 1.5] if wrong else [0.3, 0.3], f"{sample + 2}" if wrong else "1")


async def solved(plans: list[tuple[list[float], str]], **settings: Any) -> dict[str, Any]:
    graph = build_graph(backbone=FakeLogprobChat(responder=Traces(plans)))
    ctx = Context(strategy="critic", gate="never", step_format="paragraph", **settings)
    return await graph.ainvoke({"question": QUESTION}, context=ctx)


async def recorded_traces() -> list[RunRecord]:
    records = []
    for q in range(QUESTIONS):
        for sample in range(SAMPLES):
            output = await solved([plan(q, sample)], top_logprobs=2)
            key = JobKey("math500", f"q{q}", "critic", "never", None, sample)
            records.append(make_record(key, "1", output, output["answer"] == "1", 0.1))
    return records


def write(folder: Path, records: list[RunRecord]) -> Path:
    store = RecordStore(folder)
    for record in records:
        store.append(record)
    return folder


async def test_the_analysis_decides_h4_to_h7_from_the_records(tmp_path: Path) -> None:
    records = await recorded_traces()
    questions, incomplete = question_traces(records)
    assert len(questions) == QUESTIONS and incomplete == []
    # Majority@4 is right unless 2 of 4 traces are wrong and answer first (a tie): q % 4 == 2
    # ties "2" against "1" with "2" first, q % 4 == 3 has three different wrong answers.
    assert majority_at(questions[1], SAMPLES) == 1.0
    assert majority_at(questions[1], 1) == 0.75
    momentum = within_question_auroc(
        questions, lambda t: -t.summary["momentum"], "momentum", resamples=200
    )
    assert momentum.value == 1.0 and momentum.questions == 9  # q % 4 == 0: no wrong trace
    report = write_report(
        write(tmp_path / "run", records), experiments=[parallel_traces.EXPERIMENT], resamples=200
    )
    text = report.markdown_path.read_text()
    assert f"## Traces: {QUESTIONS} questions x {SAMPLES} traces" in text
    for name in ("H4", "H5", "H6", "H7", "mur-esc", "DeepConf online, keep 90%"):
        assert name in text
    document = json.loads(report.json_path.read_text())["traces"]
    decisions = {d["name"]: d for d in document["hypotheses"]}
    assert decisions["H5"]["value"] == 1.0 and decisions["H5"]["supported"]
    assert document["accuracy_at_k"][0] == pytest.approx(
        sum(plan(q, s)[1] == "1" for q in range(QUESTIONS) for s in range(SAMPLES))
        / (QUESTIONS * SAMPLES)
    )
    assert report.traces_plot_path == tmp_path / "run" / "traces_accuracy_vs_tokens.png"
    assert report.traces_plot_path.stat().st_size > 0


async def test_the_online_check_compares_a_live_run_with_the_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main_folder = write(tmp_path / "recorded", await recorded_traces())
    settings = {"traces": SAMPLES, "trace_batch": 2, "settle": "agree"}
    live = []
    for q in range(QUESTIONS):
        output = await solved([plan(q, s) for s in range(SAMPLES)], **settings)
        key = JobKey("math500", f"q{q}", "critic", "never", None, 0)
        live.append(make_record(key, "1", output, output["answer"] == "1", 0.1))
    live_folder = write(tmp_path / "live", live)
    assert main([str(live_folder), "--predicted-by", str(main_folder), "--resamples", "50"]) == 0
    shown = capsys.readouterr().out
    assert "## Online check against" in shown and "passes" in shown
    # Settle-when-a-pair-agrees, no stop: the live run drew what every replay draws here.
    traces = sum(len(record["trace"]["traces"]) for record in live) / len(live)
    assert f"| traces / question | {traces:.2f} |" in shown
    assert "| stopped / question | 0.00 | [0.00, 0.00] |" in shown
    assert "Online check" in (live_folder / "report.md").read_text()
    check = json.loads((live_folder / "report.json").read_text())["online_check"]
    assert check["passes"] and check["traces_per_question"] == pytest.approx(traces)
    assert check["predicted"]["stopped"] == {"low": 0.0, "high": 0.0}
    assert main([str(live_folder), "--predicted-by", str(tmp_path / "nowhere")]) == 2
    assert "mur report:" in capsys.readouterr().err
    fewer = write(tmp_path / "fewer", (await recorded_traces())[:SAMPLES])  # q0's traces only
    assert main([str(live_folder), "--predicted-by", str(fewer)]) == 2
    missing = sorted(f"q{q}" for q in range(1, QUESTIONS))
    assert (
        f"no recorded traces for {QUESTIONS - 1} live questions: {', '.join(missing[:5])} "
        f"and {QUESTIONS - 6} more"
    ) in capsys.readouterr().err


async def live_folder(folder: Path, **settings: Any) -> Path:
    """Every question solved once live by a trace rule (`settings`), recorded as a folder."""
    records = []
    for q in range(QUESTIONS):
        output = await solved([plan(q, s) for s in range(SAMPLES)], **settings)
        key = JobKey("math500", f"q{q}", "critic", "never", None, 0)
        records.append(make_record(key, "1", output, output["answer"] == "1", 0.1))
    return write(folder, records)


RULE = {
    **parallel_traces.MUR_ESC,
    "traces": SAMPLES,
}  # mur-esc's schedule, at the 4 traces recorded here
FRESH = ["--prereg", "branching-fresh", "--resamples", "50"]


@pytest.fixture
def fresh_prereg(monkeypatch: pytest.MonkeyPatch) -> None:
    """branching-fresh as registered, but planned on this module's 12 questions and with its
    arms' schedule at 4 traces (the recorded traces here are 4 a question)."""
    registered = EXPERIMENTS["branching-fresh"]
    arms = {name: {**wanted, "traces": SAMPLES} for name, wanted in registered.arms.items()}
    scaled = replace(registered, questions=QUESTIONS, arms=arms)
    monkeypatch.setitem(EXPERIMENTS.entries, "branching-fresh", scaled)


def decisions_of(folder: str) -> dict[str, dict[str, Any]]:
    document = json.loads((Path(folder) / "report.json").read_text())["traces"]
    return {d["name"]: d for d in document["hypotheses"]}


async def test_live_branching_arms_decide_h8_to_h11_beside_the_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_prereg: None
) -> None:
    recorded = str(write(tmp_path / "recorded", await recorded_traces()))
    mur = await live_folder(tmp_path / "mur", **RULE, branch="mur_max", top_logprobs=2)
    random = await live_folder(tmp_path / "random", **RULE, branch="random", top_logprobs=2)
    assert main([recorded, *FRESH]) == 0
    pending = capsys.readouterr().out
    assert "results/prereg-branching-fresh.md" in pending
    assert "| H10: branching economy" in pending and "not decided: no live folder 'mur'" in pending
    assert main([recorded, *FRESH, "--live", f"mur={mur}", "--live", f"random={random}"]) == 0
    shown, said = capsys.readouterr()
    assert "pending" not in shown and "Live rules, each against majority@4" in shown
    assert str(Path(recorded) / "traces_accuracy_vs_tokens.png") in said  # "written: ..."
    assert "- mur: 24 of 24 warm-up traces offered its rule a branch point (mur_max: MUR: " in shown
    assert "- random: 24 of 24 warm-up traces offered its rule a branch point (random: " in shown
    document = json.loads((Path(recorded) / "report.json").read_text())["traces"]
    decisions = decisions_of(recorded)
    assert set(decisions) == {"H8", "H9", "H10", "H11"}
    assert all(d["supported"] is not None for d in decisions.values())
    arms = {row["name"]: row for row in document["live"]}
    assert arms["mur"]["questions"] == QUESTIONS and arms["mur"]["branched_per_question"] > 0
    assert "branch mur_max" in arms["mur"]["rule"] and "branch random" in arms["random"]["rule"]
    # the live arm's tokens are what its runs spent, against majority@4's on the same questions
    spent = sum(r["usage"]["backbone_tokens"] for r in load_records(mur))
    assert arms["mur"]["tokens_per_question"] == pytest.approx(spent / QUESTIONS)


async def test_hypotheses_wait_for_every_planned_question_and_name_the_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_prereg: None
) -> None:
    """A run in progress decides nothing: the recorded folder short of the planned questions,
    or a live arm short of the complete ones, leaves its hypotheses pending; a question whose
    recorded traces stay incomplete is left out of every analysis and named."""
    traces = await recorded_traces()
    short = str(write(tmp_path / "short", [r for r in traces if r["problem_id"] != "q11"]))
    mur = await live_folder(tmp_path / "mur", **RULE, branch="mur_max")
    random = await live_folder(tmp_path / "random", **RULE, branch="random")
    assert main([short, *FRESH, "--live", f"mur={mur}"]) == 0  # q11 not recorded yet: waits
    assert "- mur: 1 questions not compared yet: the recorded folder has no" in (
        capsys.readouterr().out
    )
    half = write(tmp_path / "half", [r for r in load_records(mur) if int(r["problem_id"][1:]) < 4])
    assert main([short, *FRESH, "--live", f"mur={half}"]) == 0
    decisions = decisions_of(short)
    assert (
        decisions["H8"]["detail"] == "pending: 11 of 12 questions recorded (11 with all 4 traces)"
    )
    assert decisions["H10"]["detail"] == (
        "pending: live folder 'mur' has 4 of 11 questions (missing q4, q5, q6, q7, q8 and 2 more)"
    )
    # q11 recorded with 3 of its 4 traces: left out, and the live arms' q11 with it
    gappy = [r for r in traces if (r["problem_id"], r["sample"]) != ("q11", 3)]
    recorded = str(write(tmp_path / "gappy", gappy))
    empty = tmp_path / "eager"
    empty.mkdir()
    live = ["--live", f"mur={mur}", "--live", f"random={random}", "--live", f"eager={empty}"]
    assert main([recorded, *FRESH, *live]) == 0
    shown = capsys.readouterr().out
    assert "Left out (a trace missing): q11." in shown
    assert "- mur: not compared, the recorded traces incomplete: q11." in shown
    assert f"Live folders with no question to compare yet: eager (`{empty}`)." in shown
    decisions = decisions_of(recorded)
    assert all(decisions[h]["supported"] is not None for h in ("H8", "H9", "H10", "H11"))
    assert "11 questions" in decisions["H11"]["detail"]


async def test_a_live_folder_under_the_wrong_arm_name_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_prereg: None
) -> None:
    recorded = str(write(tmp_path / "recorded", await recorded_traces()))
    random = await live_folder(tmp_path / "random", **RULE, branch="random")
    assert main([recorded, *FRESH, "--live", f"mur={random}"]) == 2
    err = capsys.readouterr().err
    assert f"the live folder {random} ran branch='random';" in err
    assert "arm 'mur' runs branch='mur' or 'mur_max'" in err
    with pytest.raises(SystemExit) as usage:
        main([recorded, *FRESH, "--live", f"random={random}", "--live", f"random={random}"])
    assert usage.value.code == 2 and "random given twice" in capsys.readouterr().err


async def test_a_live_folder_that_cannot_be_compared_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the recorded folder has every planned question (3 here), a live question it
    never ran means the wrong folders were paired."""
    registered = EXPERIMENTS["parallel-traces"]
    monkeypatch.setitem(EXPERIMENTS.entries, "parallel-traces", replace(registered, questions=3))
    recorded = str(write(tmp_path / "recorded", (await recorded_traces())[: SAMPLES * 3]))
    mur = await live_folder(tmp_path / "mur", traces=SAMPLES, trace_batch=2, branch="mur_max")
    assert main([recorded, "--live", f"mur={mur}"]) == 2  # 12 live questions, 3 recorded
    assert "9 questions of " in (err := capsys.readouterr().err)
    assert "have no recorded traces to compare with: q10, q11, q3, q4, q5 and 4 more" in err
    with pytest.raises(SystemExit) as usage:
        main([recorded, "--live", str(mur)])
    assert usage.value.code == 2 and "expected NAME=DIR" in capsys.readouterr().err


async def test_the_documented_experiment_is_decided_as_written(tmp_path: Path) -> None:
    """docs/extending.md's example experiment, run as the page shows it, decides its
    hypothesis on recorded traces beside majority@K."""
    page = (Path(__file__).resolve().parents[2] / "docs/extending.md").read_text()
    example = page.split("## An experiment", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(example, "docs/extending.md", "exec"), namespace)
    experiment = namespace["EXPERIMENT"]
    folder = write(tmp_path / "run", await recorded_traces())
    report = write_report(folder, experiments=[experiment], resamples=50)
    assert "Hypotheses of `results/prereg-vote-weights.md`:" in report.markdown
    assert "| confidence vote |" in report.markdown
    document = json.loads(report.json_path.read_text())["traces"]
    [decision] = document["hypotheses"]
    assert decision["name"] == "H12" and decision["detail"].startswith("pending: 12 of 200")
