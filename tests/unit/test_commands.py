"""`mur` and every subcommand of it: each answers --help under its own name, says bad input in
one line with exit status 2, and every module of the project that has a main is reachable from
the one registry (a command nobody runs in CI still breaks here: benchmarks.scaleout once
imported a function a refactor had removed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

import mur.cli
from fakes import two_step_model
from faulty_server import faulty_server
from mur.cli import solve as solve_command
from mur.cli.registry import MUR
from mur.evals.harness.records import load_records
from mur.servers.connect import Connection

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("benchmarks", "cli", "endpoint", "evals", "experiments", "servers", "testing")
# Started by a command as a process of its own, never by a user: `mur bench endpoint_load`'s
# endpoint, `mur bench client`'s fake vLLM server and each of its arms.
INTERNAL = {
    "mur.cli.fakes",
    "mur.benchmarks.client_arm",
    "mur.servers.processes.orphans",  # the shim every replica and router starts through
}
SUBCOMMANDS = dict(MUR.leaves())  # "bench scaleout" -> its registry entry
NAMES = [words.removeprefix("mur ") for words in SUBCOMMANDS]

# Bad input of each subcommand, refused before any server is touched or folder written: the
# words after `mur <name>`, and what the one line says.
BAD_INPUT = {
    "solve": (["--strategy", "beam"], "unknown strategy 'beam': choose one of critic"),
    "servers": (["up", "--profile", "no-such-profile"], "invalid choice: 'no-such-profile'"),
    "endpoint": (["--max-runs", "0"], "--max-runs: must be > 0, got 0"),
    "report": (["/nonexistent/run"], "/nonexistent/run"),
    "compare": (["/nonexistent/a", "/nonexistent/b"], "/nonexistent/a"),
    "records": (["drop", "/nonexistent/run", "--gate", "mur"], "no records.jsonl"),
    "experiment table1": (["--strategies", "beam", "--dry-run"], "unknown strategy 'beam'"),
    "experiment rescore": (["/nonexistent/run"], "/nonexistent/run"),
    "experiment verdicts": (["/nonexistent/run"], "/nonexistent/run"),
    "experiment bfcl": (["--out", "x", "--category", "simple"], "unknown category 'simple'"),
    "bench economy": (["--gates", "sometimes"], "'sometimes'"),
    "bench client": (["--arms", "floor top0,nope"], "unknown arm 'nope'"),
    "bench chaos": (["--kill-every", "60:30"], "need 0 < MIN <= MAX, got 60:30"),
    "bench endpoint_load": (["--clients", "0"], "--clients, --requests and --max-runs"),
    "bench formats": (["--formats", "bf16,int3"], "unknown format 'int3'"),
    "bench install": (["--installs", "base,a b"], "'a b' is not an extra's name"),
    "bench pair_cores": (["--ways", "diagonal"], "unknown way 'diagonal'"),
    "bench scaleout": (["--policies", "nope", "--dry-run"], "policies must be among"),
    "bench trace_time": (["--arms", "mur-esc,beam"], "unknown arm 'beam'"),
}


def run_mur(argv: list[str]) -> int:
    """`mur ARGV` in this process, as the console script runs it: its exit status."""
    try:
        return mur.cli.main(argv)
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else 1


def modules_with_a_main() -> dict[str, str]:
    """Every module that runs as a program, by its `python -m` name -> the module holding its
    main: packages with a __main__.py and modules with a main guard (private ones aside)."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = ".".join(("mur", *path.relative_to(ROOT).with_suffix("").parts))
            if path.name == "__main__.py":
                found[name.removesuffix(".__main__")] = name
            elif not path.name.startswith("_") and 'if __name__ == "__main__":' in path.read_text():
                found[name] = name
    return found


def test_every_module_with_a_main_is_a_subcommand() -> None:
    reachable = {import_module(command.module).main for command in SUBCOMMANDS.values()}
    found = modules_with_a_main()
    assert {
        "mur.cli.endpoint",
        "mur.cli.fakes",
        "mur.cli.experiment.table1",
        "mur.cli.bench.economy",
    } <= set(found)
    missing = [
        name
        for name, module in found.items()
        if name not in INTERNAL and import_module(module).main not in reachable
    ]
    assert missing == [], "add each to cli/registry.py"


def test_the_registry_names_every_subcommand_once_with_a_line_of_help() -> None:
    assert NAMES[:6] == ["solve", "servers", "endpoint", "report", "compare", "records"]
    assert {name for name in NAMES if " " in name} == {
        "experiment table1",
        "experiment rescore",
        "experiment bfcl",
        "experiment verdicts",
        "bench chaos",
        "bench client",
        "bench economy",
        "bench endpoint_load",
        "bench formats",
        "bench install",
        "bench pair_cores",
        "bench scaleout",
        "bench trace_time",
    }
    assert set(BAD_INPUT) == set(NAMES)
    assert all(command.help and "\n" not in command.help for command in SUBCOMMANDS.values())


def test_mur_help_lists_every_subcommand_without_loading_the_project() -> None:
    """`python -m mur --help` in a fresh interpreter: every subcommand with its help, and none
    of LangGraph, the model clients or the servers' processes imported to say so."""
    check = (
        "import sys; from mur.cli import main; main(['--help']); "
        "print(sorted(m for m in ('langgraph', 'langchain_openai', 'mur.graphs', "
        "'mur.servers.processes', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    *shown, loaded = done.stdout.splitlines()
    assert loaded == "[]"
    assert shown[0] == "usage: mur <command> [arguments]"
    for words, command in SUBCOMMANDS.items():
        name = words.removeprefix("mur ")
        listed = [line for line in shown if line.startswith(f"  {name}  ")]
        assert len(listed) == 1 and listed[0].endswith(command.help), name


def test_python_m_mur_without_arguments_prints_the_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mur"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: mur <command>") and "bench scaleout" in done.stdout


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["serve"],
            "mur: error: unknown command 'serve': choose one of solve, servers, endpoint, ",
        ),
        (["bench", "tokens"], "mur bench: error: unknown command 'tokens': choose one of chaos, "),
        (["--strategy", "critic"], "mur: error: unknown option '--strategy': options go after"),
    ],
)
def test_an_unknown_subcommand_is_one_line_naming_it_and_the_valid_ones(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_mur(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(says) and err[0].endswith("; see --help")


@pytest.mark.parametrize("name", NAMES)
def test_each_subcommand_answers_help_under_its_own_name(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_mur([*name.split(), "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: mur {name} ")


@pytest.mark.parametrize("name", NAMES)
def test_each_subcommand_says_bad_input_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, says = BAD_INPUT[name]
    monkeypatch.chdir(ROOT)
    assert run_mur([*name.split(), *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"mur {name}") and says in err[0], err[0]  # `mur servers up: `


@pytest.mark.parametrize("name", NAMES)
def test_each_subcommand_says_an_unknown_flag_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_mur([*name.split(), "--no-such-flag"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"mur {name}: error: "), err
    assert err[0].endswith("; see --help")


def test_a_benchmark_then_its_report_comparison_and_records(
    tmp_path: Path, test_data: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`mur solve --dataset` on the scripted model, then the commands that read its folder."""
    model = two_step_model()
    monkeypatch.setattr(solve_command, "connect", lambda args, say: Connection(model, model))
    # As `python -m mur` sets it (not pytest's own, which differs under pytest-xdist)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "mur" / "__main__.py")])
    out = tmp_path / "run"
    benchmark = ["--strategy", "critic", "--dataset", "math500", "--data-dir", str(test_data),
                 "--limit", "2", "--gate", "never,always", "--concurrency", "2"]  # fmt: skip
    assert run_mur(["solve", *benchmark, "--out", str(out)]) == 0
    assert " -m mur solve --strategy critic " in (out / "command.txt").read_text()
    assert run_mur(["report", str(out)]) == 0
    assert (out / "report.md").is_file()
    assert run_mur(["compare", str(out), str(out)]) == 0
    assert "| math500 critic never | 2 |" in capsys.readouterr().out
    assert run_mur(["records", "drop", str(out), "--gate", "always"]) == 0
    assert "dropped 2 runs of always" in capsys.readouterr().out
    assert {record["gate"] for record in load_records(out)} == {"never"}


def test_mur_servers_lists_its_profiles_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The read-only server commands, in a MUR_HOME of their own (the running servers untouched)."""
    monkeypatch.setenv("MUR_HOME", str(tmp_path))
    monkeypatch.setenv("MUR_CPU_WEIGHTS", "w8a8")
    monkeypatch.setenv("MUR_CPU_DTYPE", "float32")
    assert run_mur(["servers", "profiles"]) == 0
    listed = capsys.readouterr().out
    assert "Qwen2.5-Coder-1.5B-Instruct  w8a8 weights, float32\n" in listed  # what `up` serves
    assert "Qwen3-8B\n" in listed  # a GPU profile: vLLM's own choices
    assert run_mur(["servers", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_mur_solve_and_run_py_solve_alike_on_a_server() -> None:
    """The same question through `python -m mur solve` and `python run.py`, against the
    loopback fake server: the same answer, the same steps."""
    results = []
    for program in (["-m", "mur", "solve"], ["run.py"]):
        with faulty_server(["ok"]) as server:
            done = subprocess.run(
                [sys.executable, *program, "--strategy", "critic", "--gate", "never", "--json",
                 "--base-url", server.base_url],
                cwd=ROOT, capture_output=True, text=True, timeout=120,
                env={k: v for k, v in os.environ.items() if not k.startswith("MUR_")},
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
        results.append(done.stdout)
    mur_solve, run_py = (json.loads(out) for out in results)
    assert mur_solve["answer"] == run_py["answer"] == "4"
    assert [s["text"] for s in mur_solve["steps"]] == [s["text"] for s in run_py["steps"]]
