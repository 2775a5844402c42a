"""run.py on bad input: exit status 2 and one clear line, before any server is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import run

ROOT = Path(__file__).resolve().parents[2]

BAD = {
    "unknown strategy": (["--strategy", "beam"], "invalid choice"),
    "gamma zero": (["--strategy", "critic", "--gamma", "0"], "gamma must be"),
    "gamma negative": (["--strategy", "critic", "--gamma", "-1"], "gamma must be"),
    "gamma not a number": (["--strategy", "critic", "--gamma", "abc"], "not a list of float"),
    "alpha one": (["--strategy", "critic", "--alpha", "1"], "alpha must lie"),
    "unknown gate": (["--strategy", "critic", "--gate", "sometimes"], "unknown gate"),
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
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert message in err[-1]
    assert not any("Traceback" in line for line in err)


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
