"""`mur solve` (and run.py) on bad input: exit status 2 and one clear line, before any server is
touched; its flags, settings, recorded command and printer."""

from __future__ import annotations

import io
import json
import os
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

import mur.cli
from fakes import two_step_model
from mur.cli import evaluation, flags, validation
from mur.cli import solve as solve_command
from mur.cli.args import OneLineParser, positive_float, positive_int
from mur.cli.printer import Printer
from mur.cli.registry import MUR
from mur.evals.questions import loading as datasets
from mur.graphs import Context
from mur.servers.connect import Connection

ROOT = Path(__file__).resolve().parents[2]

BAD = {
    "unknown strategy": (
        ["--strategy", "beam"],
        "unknown strategy 'beam': choose one of critic, best_of_n, foresight, thinking",
    ),
    "stop rule without batches": (
        ["--strategy", "critic", "--traces", "4", "--trace-stop", "momentum"],
        "settle, trace_stop and branch act between batches: set trace_batch below traces (4), got "
        "None",
    ),
    "confidence vote without top logprobs": (
        ["--strategy", "critic", "--traces", "4", "--vote", "confidence"],
        "vote confidence reads token confidences: set top_logprobs (e.g. 20)",
    ),
    "gamma zero": (["--strategy", "critic", "--gamma", "0"], "gamma must be"),
    "gamma negative": (["--strategy", "critic", "--gamma", "-1"], "gamma must be"),
    "gamma not a number": (["--strategy", "critic", "--gamma", "abc"], "not a list of float"),
    "alpha one": (["--strategy", "critic", "--alpha", "1"], "alpha must be less than 1, got 1"),
    "unknown gate": (
        ["--strategy", "critic", "--gate", "sometimes"],
        "unknown gate 'sometimes': choose one of never, always, mur, average, smart, "
        "first_token, random",
    ),
    "unknown gate in a list": (
        ["--strategy", "critic", "--dataset", "math500", "--gate", "mur,sometimes"],
        "unknown gate 'sometimes': choose one of never",
    ),
    "bad choice": (
        ["--strategy", "critic", "--thinking-style", "deep"],
        "unknown thinking_style 'deep': choose one of prefix, qwen3",
    ),
    "rate out of range": (
        ["--strategy", "critic", "--target-scale-rate", "0.5,1.5"],
        "target_scale_rate must be less than or equal to 1, got 1.5",
    ),
    "limit zero": (["--strategy", "critic", "--dataset", "math500", "--limit", "0"], "--limit"),
    "negative offset": (
        ["--strategy", "critic", "--dataset", "math500", "--offset", "-1"],
        "--offset must be >= 0, got -1",
    ),
    "offset past the last question": (
        ["--strategy", "critic", "--dataset", "math500", "--offset", "100000"],
        "offset 100000 skips every question of math500, which has 500: give an offset below 500",
    ),
    "out naming a file": (
        ["--strategy", "critic", "--dataset", "math500", "--out", str(ROOT / "README.md")],
        "README.md is a file: give a folder",
    ),
    "out without dataset": (["--strategy", "critic", "--out", "runs"], "add --dataset"),
    "checkpoint in a missing folder": (
        ["--strategy", "critic", "--checkpoint", "/nonexistent/runs/x.sqlite"],
        "--checkpoint: cannot open the checkpointer /nonexistent/runs/x.sqlite: the folder "
        "/nonexistent/runs does not exist",
    ),
    "offset without dataset": (["--strategy", "critic", "--offset", "200"], "add --dataset"),
    "unknown dataset": (["--strategy", "critic", "--dataset", "mathx"], "unknown dataset"),
    "unreadable data dir": (
        ["--strategy", "critic", "--dataset", "math500", "--data-dir", "/nonexistent"],
        "--data-dir",
    ),
    "empty question": (["--strategy", "critic", "--question", "  "], "question is empty"),
    "control character": (["--strategy", "critic", "--question", "a\x00b"], "control character"),
    "huge question": (["--strategy", "critic", "--question", "x" * 200_001], "characters"),
    "max steps zero": (["--strategy", "critic", "--max-steps", "0"], "max_steps"),
    "gate list without dataset": (["--strategy", "critic", "--gate", "mur,never"], "--dataset"),
    "bad gate label": (["--strategy", "critic", "--gate", "mur@0.5"], "only random takes a rate"),
    "model without url": (["--strategy", "critic", "--model", "m"], "--base-url"),
    "replicas as a url list": (
        ["--strategy", "critic", "--base-url", "http://a:8000/v1,http://b:8000/v1"],
        "--base-url takes one URL, got 'http://a:8000/v1,http://b:8000/v1': to spread questions "
        "over replicas, start them behind vllm-router with `mur servers up --replicas N`",
    ),
    "verifier replicas as a url list": (
        ["--strategy", "critic", "--verifier-url", "a:1,b:2"],
        "--verifier-url takes one URL",
    ),
    "unknown profile": (
        ["--strategy", "critic", "--profile", "nope", "--base-url", "http://127.0.0.1:9/v1"],
        "argument --profile: unknown server profile 'nope': choose one of cpu-qwen-0.5b, ",
    ),
    "unknown verifier profile": (
        ["--strategy", "critic", "--verifier-profile", "nope"],
        "argument --verifier-profile: unknown server profile 'nope': choose one of ",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_exits_2_with_one_line(name: str, capsys, monkeypatch) -> None:
    argv, message = BAD[name]

    def no_server(*args, **kwargs):
        raise AssertionError("no server may be contacted for bad input")

    monkeypatch.setattr(solve_command, "connect", no_server)
    try:
        status = mur.cli.main(["solve", *argv])
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    err = capsys.readouterr().err.splitlines()
    assert status == 2
    assert len(err) == 1, err  # the line, not argparse's usage block before it
    assert err[0].startswith("mur solve: error: ") and message in err[0]
    assert err[0].endswith("; see --help")  # argparse's errors and the command's own alike


def test_non_utf8_question_from_the_shell() -> None:
    done = subprocess.run(
        [sys.executable, "run.py", "--strategy", "critic", "--question", b"caf\xe9 au lait"],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        env={**os.environ, "MUR_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert done.returncode == 2
    assert b"UTF-8" in done.stderr and b"Traceback" not in done.stderr


def test_every_context_field_has_a_flag_of_its_name() -> None:
    parser = solve_command.build_parser()
    dests = {action.dest: action for action in parser._actions}
    for name in Context.field_names():
        assert name in dests, f"Context.{name} has no `mur solve` flag"
        assert f"--{name.replace('_', '-')}" in dests[name].option_strings
    args = parser.parse_args(["--strategy", "critic"])
    assert flags.flag_settings(args) == {}  # unset flags leave the defaults to Context
    assert flags.single_context(args, {}) == Context()


def test_flags_reach_the_context_and_sweeps_take_lists() -> None:
    argv = [
        "--strategy=critic",
        "--scale-cost-factor=2.5",
        "--bias-correction",
        "--foresight-selection=argmax",
        "--max-steps=3",
        "--seed=7",
    ]
    args = solve_command.build_parser().parse_args(argv)
    profile = {"max_steps": 8, "max_step_tokens": 256, "not_a_setting": 1}
    context = flags.single_context(args, profile)
    assert context == Context(
        scale_cost_factor=2.5,
        bias_correction=True,
        foresight_selection="argmax",
        max_steps=3,
        max_step_tokens=256,
        seed=7,
    )
    sweep = ["--strategy=critic", "--dataset=math500", "--gate=mur,never", "--gamma=0.5,0.9"]
    args = solve_command.build_parser().parse_args([*sweep, "--budget-tokens=300,600"])
    assert flags.gates(args) == ["mur", "never"] and flags.gammas(args) == [0.5, 0.9]
    assert flags.budget_settings(args) == [("budget_tokens", 300), ("budget_tokens", 600)]
    plan = evaluation.evaluation_plan(args, [], Connection(None, None, profile, ""), "cmd")
    assert plan.gates == ("mur", "never") and plan.gammas == (0.5, 0.9)
    assert plan.settings == {"max_steps": 8, "max_step_tokens": 256}
    assert plan.command == "cmd"


def test_a_gate_label_brings_its_settings_to_a_single_solve() -> None:
    args = solve_command.build_parser().parse_args(["--strategy=critic", "--gate=mur+bc"])
    validation.validate(args)
    assert flags.single_context(args, {}) == Context(gate="mur", bias_correction=True)
    args = solve_command.build_parser().parse_args(["--strategy=critic", "--gate=random@0.2"])
    assert flags.single_context(args, {}) == Context(gate="random", random_rate=0.2)


def test_the_recorded_command_is_the_one_typed() -> None:
    command = evaluation.command_line(["--strategy", "critic", "--question", "a b"], "run.py")
    assert command.endswith("run.py --strategy critic --question 'a b'")


def test_the_mur_command_is_recorded_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console script (pyproject [project.scripts]): no interpreter in front of it; `python
    -m mur` with its interpreter; run.py as the script it is."""
    argv = ["--strategy", "critic", "--gate", "a b"]
    monkeypatch.setattr(sys, "argv", ["/opt/env/bin/mur", "solve", *argv])
    recorded = evaluation.command_line(argv, "mur solve")
    assert recorded == "/opt/env/bin/mur solve --strategy critic --gate 'a b'"
    monkeypatch.setattr(sys, "argv", ["/src/mur/__main__.py", "solve", *argv])
    recorded = evaluation.command_line(argv, "mur solve")
    assert recorded.endswith(" -m mur solve --strategy critic --gate 'a b'")
    monkeypatch.setattr(sys, "argv", ["run.py", "--strategy", "critic"])
    assert evaluation.command_line(None, "run.py").endswith(" run.py --strategy critic")


def test_mur_is_the_one_command_and_run_py_its_solve() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"mur": "mur.cli:main"}
    assert MUR.find("solve").module == solve_command.__name__
    assert runpy.run_path(str(ROOT / "run.py"))["main"] is solve_command.main


def test_absent_gpqa_exits_2_saying_where_to_put_it(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "_SHARED_DATA_DIR", tmp_path / "absent")
    monkeypatch.setattr(
        solve_command, "connect", lambda *a, **k: pytest.fail("no server for bad input")
    )
    argv = ["--strategy", "critic", "--dataset", "gpqa_diamond", "--limit", "1"]
    status = solve_command.main(argv, prog="run.py")
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert "not shipped" in err[0] and "MUR_DATA_DIR" in err[0] and "--data-dir" in err[0]


def test_the_fallback_prints_as_text_without_markup_tags() -> None:
    printer = Printer(enabled=True)
    printer.console = Console(file=io.StringIO(), highlight=False, width=200)
    usage = dict.fromkeys(
        ("backbone_tokens", "external_tokens", "backbone_prompt_tokens", "llm_calls"), 1
    )
    printer.result(
        {
            "usage": {**usage, "external_prompt_tokens": 0},
            "steps": [],
            "fallback": {"text": "so [b]the answer[/b] is 4."},
            "answer": "4",
            "finish_reason": "max_steps",
        }
    )
    shown = printer.console.file.getvalue()
    assert "fallback: so [b]the answer[/b] is 4." in shown and "[dim]" not in shown


# ------------------------------------------------------------------ solving on a scripted model


def scripted_connection() -> Connection:
    """The scripted fake model as the backbone (and judge): a step, then the answer 7."""
    model = two_step_model()
    return Connection(model, model, {}, None)


@pytest.mark.parametrize("prog", ["mur solve", "run.py"])
def test_solve_prints_each_step_then_the_answer(prog: str, capsys, monkeypatch) -> None:
    monkeypatch.setattr(solve_command, "connect", lambda args, say: scripted_connection())
    argv = ["--strategy", "critic", "--gate", "never", "--question", "What is 3 + 4?"]
    if prog == "run.py":
        assert solve_command.main(argv, prog=prog) == 0
    else:
        assert mur.cli.main(["solve", *argv]) == 0
    out = capsys.readouterr().out
    assert "Question: What is 3 + 4?" in out and "Step1" in out and "kept" in out
    assert "Answer: 7" in out and "LLM calls" in out


def test_several_traces_print_whose_step_each_is_and_the_vote(capsys, monkeypatch) -> None:
    monkeypatch.setattr(solve_command, "connect", lambda args, say: scripted_connection())
    argv = ["--strategy", "critic", "--gate", "never", "--question", "What is 3 + 4?",
            "--traces", "3", "--trace-batch", "2", "--branch", "mur_max"]  # fmt: skip
    assert solve_command.main(argv, prog="mur solve") == 0
    out = capsys.readouterr().out
    assert "trace 0  Step1" in out and "trace 1  Step2" in out
    # the third trace kept trace 0's first step and drew only the second
    assert "trace 2 (branch of 0 at step 2)  Step2" in out
    assert "trace 2 (branch of 0 at step 2)  Step1" not in out
    assert "Traces: 3 traces (1 branched, 0 stopped); vote: 7 x3" in out
    assert "Answer: 7" in out


def test_solve_json_is_the_output_contract(capsys, monkeypatch) -> None:
    monkeypatch.setattr(solve_command, "connect", lambda args, say: scripted_connection())
    argv = ["solve", "--strategy", "critic", "--gate", "always", "--max-steps", "3", "--json"]
    assert mur.cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["answer"] == "7" and result["config"]["gate"] == "always"
    assert result["steps"] and all(step["scaled"] for step in result["steps"])


# ------------------------------------------------------------ every parser of the project


def project_sources() -> list[Path]:
    """The project's Python files, relative to its root: not the tests' own, nor anything in
    a hidden or build folder (a virtualenv inside the checkout included)."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [
            name
            for name in subfolders
            if not name.startswith((".", "__")) and name not in ("tests", "build", "dist")
        ]
        found += [Path(folder, name).relative_to(ROOT) for name in files if name.endswith(".py")]
    return sorted(found)


def test_every_parser_is_the_one_line_parser() -> None:
    """A command written with plain argparse would print its usage block again."""
    plain = [
        str(path)
        for path in project_sources()
        if "argparse.ArgumentParser(" in (ROOT / path).read_text(encoding="utf-8")
    ]
    assert plain == [], "use cli.args.OneLineParser"


def test_the_usage_error_is_one_line_through_the_shell() -> None:
    done = subprocess.run(
        [sys.executable, "run.py", "--strategy", "beam"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("run.py: error: unknown strategy 'beam': choose one of critic")
    assert done.stderr.endswith("; see --help\n") and done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--runs", "0"], "argument --runs: must be > 0, got 0"),
        (["--runs", "two"], "argument --runs: 'two' is not an integer"),
        (["--share", "-0.5"], "argument --share: must be > 0, got -0.5"),
        (["--share", "inf"], "argument --share: must be > 0, got inf"),
        (["--share", "half"], "argument --share: 'half' is not a number"),
    ],
)
def test_positive_flags_refuse_bad_values_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = OneLineParser(prog="mur demo")
    parser.add_argument("--runs", type=positive_int)
    parser.add_argument("--share", type=positive_float)
    assert vars(parser.parse_args(["--runs", "3", "--share", "0.5"])) == {"runs": 3, "share": 0.5}
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"mur demo: error: {says}; see --help\n"
