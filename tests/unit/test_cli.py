"""run.py on bad input: exit status 2 and one clear line, before any server is touched."""

from __future__ import annotations

import io
import os
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

import run
from mur.evals.questions import loading as datasets
from mur.graphs import Context

ROOT = Path(__file__).resolve().parents[2]

BAD = {
    "unknown strategy": (["--strategy", "beam"], "invalid choice"),
    "stop rule without batches": (
        ["--strategy", "critic", "--traces", "4", "--trace-stop", "momentum"],
        "settle and trace_stop act between batches: set trace_batch below traces (4), got None",
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
        "gate must be 'never', 'always', 'mur'",
    ),
    "unknown gate in a list": (
        ["--strategy", "critic", "--dataset", "math500", "--gate", "mur,sometimes"],
        "got 'sometimes'",
    ),
    "bad choice": (["--strategy", "critic", "--thinking-style", "deep"], "invalid choice"),
    "rate out of range": (
        ["--strategy", "critic", "--target-scale-rate", "0.5,1.5"],
        "target_scale_rate must be less than or equal to 1, got 1.5",
    ),
    "limit zero": (["--strategy", "critic", "--dataset", "math500", "--limit", "0"], "--limit"),
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
        "over replicas, start them behind vllm-router with `python -m servers up --replicas N`",
    ),
    "verifier replicas as a url list": (
        ["--strategy", "critic", "--verifier-url", "a:1,b:2"],
        "--verifier-url takes one URL",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_exits_2_with_one_line(name: str, capsys, monkeypatch) -> None:
    argv, message = BAD[name]

    def no_server(*args, **kwargs):
        raise AssertionError("no server may be contacted for bad input")

    monkeypatch.setattr(run, "connect", no_server)
    try:
        status = run.main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    err = capsys.readouterr().err.splitlines()
    assert status == 2
    assert len(err) == 1, err  # the line, not argparse's usage block before it
    assert err[0].startswith("run.py: error: ") and message in err[0]
    assert err[0].endswith("; see --help")  # argparse's errors and run.py's own alike


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
    parser = run.build_parser()
    dests = {action.dest: action for action in parser._actions}
    for name in Context.field_names():
        assert name in dests, f"Context.{name} has no run.py flag"
        assert f"--{name.replace('_', '-')}" in dests[name].option_strings
    args = parser.parse_args(["--strategy", "critic"])
    assert run.flag_settings(args) == {}  # unset flags leave the defaults to Context
    assert run.single_context(args, {}) == Context()


def test_flags_reach_the_context_and_sweeps_take_lists() -> None:
    argv = [
        "--strategy=critic",
        "--scale-cost-factor=2.5",
        "--bias-correction",
        "--foresight-selection=argmax",
        "--max-steps=3",
        "--seed=7",
    ]
    args = run.build_parser().parse_args(argv)
    profile = {"max_steps": 8, "max_step_tokens": 256, "not_a_setting": 1}
    context = run.single_context(args, profile)
    assert context == Context(
        scale_cost_factor=2.5,
        bias_correction=True,
        foresight_selection="argmax",
        max_steps=3,
        max_step_tokens=256,
        seed=7,
    )
    sweep = ["--strategy=critic", "--dataset=math500", "--gate=mur,never", "--gamma=0.5,0.9"]
    args = run.build_parser().parse_args([*sweep, "--budget-tokens=300,600"])
    assert run.gates(args) == ["mur", "never"] and run.gammas(args) == [0.5, 0.9]
    assert run.budget_settings(args) == [("budget_tokens", 300), ("budget_tokens", 600)]
    plan = run.benchmark_plan(args, [], run.Connection(None, None, profile, ""), "cmd")
    assert plan.gates == ("mur", "never") and plan.gammas == (0.5, 0.9)
    assert plan.settings == {"max_steps": 8, "max_step_tokens": 256}
    assert plan.command == "cmd"


def test_a_gate_label_brings_its_settings_to_a_single_solve() -> None:
    args = run.build_parser().parse_args(["--strategy=critic", "--gate=mur+bc"])
    run.validate(args)
    assert run.single_context(args, {}) == Context(gate="mur", bias_correction=True)
    args = run.build_parser().parse_args(["--strategy=critic", "--gate=random@0.2"])
    assert run.single_context(args, {}) == Context(gate="random", random_rate=0.2)


def test_the_recorded_command_is_the_one_typed() -> None:
    command = run.command_line(["--strategy", "critic", "--question", "a b"])
    assert command.endswith("run.py --strategy critic --question 'a b'")


def test_the_mur_command_is_recorded_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console script (pyproject [project.scripts]): no interpreter in front of it."""
    monkeypatch.setattr(sys, "argv", ["/opt/env/bin/mur", "--strategy", "critic", "--gate", "a b"])
    assert run.command_line(None) == "/opt/env/bin/mur --strategy critic --gate 'a b'"
    monkeypatch.setattr(sys, "argv", ["run.py", "--strategy", "critic"])
    assert run.command_line(None).endswith(" run.py --strategy critic")


def test_mur_is_run_py_installed_as_a_command() -> None:
    project = tomllib.loads((Path(run.__file__).parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"mur": "run:main"}
    assert "run" in project["tool"]["setuptools"]["py-modules"]


def test_absent_gpqa_exits_2_saying_where_to_put_it(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "_SHARED_DATA_DIR", tmp_path / "absent")
    monkeypatch.setattr(run, "connect", lambda *a, **k: pytest.fail("no server for bad input"))
    status = run.main(["--strategy", "critic", "--dataset", "gpqa_diamond", "--limit", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert "not shipped" in err[0] and "MUR_DATA_DIR" in err[0] and "--data-dir" in err[0]


def test_the_fallback_prints_as_text_without_markup_tags() -> None:
    printer = run.Printer(enabled=True)
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


# ------------------------------------------------------------ every command line of the project


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


def command_lines() -> dict[str, str]:
    """Every command a user runs, found by its main guard (so a new or moved one is found
    too): a module name for `python -m`, or a script path. Private helpers (`_name.py`) and
    the tests' own scripts are not commands."""
    commands = {}
    for relative in project_sources():
        path = ROOT / relative
        if path.name.startswith("_") and path.name != "__main__.py":
            continue
        guarded = 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
        if not guarded and path.name != "__main__.py":
            continue
        if len(relative.parts) == 1:
            commands[relative.name] = str(relative)  # a script beside the packages: run.py
        else:
            module = ".".join(relative.with_suffix("").parts).removesuffix(".__main__")
            commands[f"python -m {module}"] = module
    return commands


COMMANDS = command_lines()
# Errors a subcommand's own parser finds: they are one line as well.
SUBCOMMAND_ERRORS = {
    "python -m servers up": ["up", "--profile", "no-such-profile"],
    "python -m servers down": ["down", "--all", "--profile", "cpu-tiny"],
    "python -m evals.harness.records drop": ["drop"],
}


def usage_error_of(command: str, argv: list[str], capsys, monkeypatch) -> tuple[object, list[str]]:
    """Run `command` as `python -m`/`python SCRIPT` would, in this process: (its exit
    status, its stderr lines)."""
    target = COMMANDS[command]
    monkeypatch.setattr(sys, "argv", [target, *argv])
    with pytest.raises(SystemExit) as stopped:
        if target.endswith(".py"):
            runpy.run_path(str(ROOT / target), run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    return stopped.value.code, capsys.readouterr().err.splitlines()


def test_every_command_line_is_found() -> None:
    assert {"run.py", "python -m servers", "python -m endpoint"} <= set(COMMANDS)
    assert any(c.startswith("python -m evals.") for c in COMMANDS)
    assert any(c.startswith("python -m benchmarks.") for c in COMMANDS)


# runpy warns that it runs a module already imported (by an earlier test): as `python -m` would.
one_run = pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")


@one_run
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_line_says_a_usage_error_in_one_line(command, capsys, monkeypatch) -> None:
    status, err = usage_error_of(command, ["--no-such-flag"], capsys, monkeypatch)
    assert status == 2
    assert len(err) == 1, err
    assert err[0].endswith("; see --help") and ": error: " in err[0]


@one_run
@pytest.mark.parametrize("subcommand", SUBCOMMAND_ERRORS)
def test_a_subcommand_says_a_usage_error_in_one_line(subcommand, capsys, monkeypatch) -> None:
    command = subcommand.rsplit(" ", 1)[0]
    status, err = usage_error_of(command, SUBCOMMAND_ERRORS[subcommand], capsys, monkeypatch)
    assert status == 2
    assert err == [err[0]] and err[0].startswith(f"{subcommand}: error: "), err


def test_every_parser_is_the_one_line_parser() -> None:
    """A command written with plain argparse would print its usage block again."""
    plain = [
        str(path)
        for path in project_sources()
        if "argparse.ArgumentParser(" in (ROOT / path).read_text(encoding="utf-8")
    ]
    assert plain == [], "use servers.cli.OneLineParser"


def test_the_usage_error_is_one_line_through_the_shell() -> None:
    done = subprocess.run(
        [sys.executable, "run.py", "--strategy", "beam"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("run.py: error: argument --strategy: invalid choice: 'beam'")
    assert done.stderr.endswith("; see --help\n") and done.stderr.count("\n") == 1
