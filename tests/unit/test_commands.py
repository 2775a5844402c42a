"""Every command of the project imports and answers --help: a command nobody runs in CI still
breaks here (benchmarks.scaleout once imported a function a refactor had removed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("mur/benchmarks", "mur/endpoint", "mur/evals", "mur/experiments", "mur/servers")


def commands() -> list[str]:
    """`python -m` names of the modules that run as commands: packages with a __main__.py and
    modules with a main guard (private ones, like a server's converter, aside)."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = path.relative_to(ROOT).with_suffix("").parts
            if path.name == "__main__.py":
                found.append(".".join(module[:-1]))
            elif not path.name.startswith("_") and 'if __name__ == "__main__":' in path.read_text():
                found.append(".".join(module))
    return found


def test_the_commands_are_found() -> None:
    assert set(commands()) == {
        "mur.benchmarks.bench",
        "mur.benchmarks.endpoint_load",
        "mur.benchmarks.fake_endpoint",
        "mur.benchmarks.pair_cores",
        "mur.benchmarks.scaleout",
        "mur.endpoint",
        "mur.evals.compare",
        "mur.evals.harness.records",
        "mur.evals.report",
        "mur.experiments.rescore",
        "mur.experiments.table1",
        "mur.experiments.verdicts",
        "mur.servers",
    }


@pytest.mark.parametrize("command", [*commands(), "run.py"])
def test_the_command_answers_help(command: str) -> None:
    argv = [command] if command.endswith(".py") else ["-m", command]
    done = subprocess.run(
        [sys.executable, *argv, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ")
