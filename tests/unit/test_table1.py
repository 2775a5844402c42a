"""experiments.table1: the phases of the paper's table, the random rate taken from MUR's records,
resuming and stopping."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from mur.cli.experiment.table1 import PROG, main
from mur.experiments import table1
from mur.experiments.presets import DatasetRun
from mur.experiments.table1 import Table1Error, Table1Plan, mur_program, run_mur, run_table
from mur.nodes.gate_labels import STANDARD_LABELS as MAIN_GATES


def plan(tmp_path: Path, **overrides) -> Table1Plan:
    settings = {
        "strategies": ("critic", "best_of_n"),
        "datasets": (DatasetRun("math500", limit=2, gamma=0.9),),
        "sweep": (0.7, 0.95),
        "sweep_strategies": ("critic",),
        "results": tmp_path,
        "tag": "model",
        "run_args": ("--concurrency", "4"),
    }
    return Table1Plan(**{**settings, **overrides})


def write_mur(folder: Path, questions: int, steps: int = 5, scaled: int = 1) -> None:
    """MUR records at gamma 0.9 as the runner writes them (the fields the rate reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "records.jsonl").open("a") as handle:
        for q in range(questions):
            record = {"key": f"p{q}/{steps}/{scaled}", "problem_id": f"p{q}", "sample": 0,
                      "gate": "mur", "gamma": 0.9, "steps_total": steps,
                      "steps_scaled": scaled}  # fmt: skip
            handle.write(json.dumps(record) + "\n")


def test_phases_main_random_then_sweep_for_the_sweep_strategies_only(tmp_path: Path) -> None:
    phases = plan(tmp_path).phases()
    assert [(p.strategy, p.name) for p in phases] == [
        ("critic", "main"),
        ("best_of_n", "main"),
        ("critic", "random"),
        ("best_of_n", "random"),
        ("critic", "sweep"),
    ]
    main_phase, sweep = phases[0], phases[4]
    assert main_phase.folder == tmp_path / "math500-critic-model"
    assert plan(tmp_path).argv(main_phase) == [
        "--strategy", "critic", "--dataset", "math500", "--limit", "2",
        "--gate", ",".join(MAIN_GATES), "--gamma", "0.9",
        "--concurrency", "4", "--out", str(tmp_path / "math500-critic-model"),
    ]  # fmt: skip
    assert plan(tmp_path).argv(sweep)[6:10] == ["--gate", "mur", "--gamma", "0.7,0.95"]


def test_random_rate_waits_for_every_question_of_mur(tmp_path: Path) -> None:
    table = plan(tmp_path)
    random_phase = table.phases()[2]
    folder = random_phase.folder
    with pytest.raises(Table1Error, match=r"has MUR \(gamma 0.9\) on 0: the main phase"):
        table.random_gate(random_phase)
    write_mur(folder, 1)
    with pytest.raises(Table1Error, match=r"over all 2 questions,.* on 1"):
        table.random_gate(random_phase)
    write_mur(folder, 2, steps=4, scaled=1)  # p0, p1 again: still two questions
    # 1 + 1 + 1 scaled of 4 + 3 + 3 steps after the first.
    assert table.random_gate(random_phase) == "random@0.3"


def test_progress_counts_the_runs_each_phase_asks_for(tmp_path: Path) -> None:
    table = plan(tmp_path, strategies=("critic",))
    main_phase, random_phase, sweep = table.phases()
    assert [table.progress(p) for p in (main_phase, random_phase, sweep)] == [
        (0, 12),
        (0, 2),
        (0, 4),
    ]
    write_mur(table.folder("math500", "critic"), 2)  # gamma 0.9: the main phase's, not the sweep's
    with (table.folder("math500", "critic") / "records.jsonl").open("a") as handle:
        # random@0.5 is not MUR's rate (0.25): a hand-run baseline, not the phase's runs.
        for gate, gamma in [("never", None), ("random@0.25", None), ("random@0.5", None),
                            ("mur", 0.7)]:  # fmt: skip
            handle.write(json.dumps({"key": gate, "gate": gate, "gamma": gamma}) + "\n")
    assert [table.progress(p) for p in (main_phase, random_phase, sweep)] == [
        (3, 12),
        (1, 2),
        (1, 4),
    ]


def test_run_table_runs_each_phase_and_resolves_the_rate_after_main(tmp_path: Path) -> None:
    table = plan(tmp_path, strategies=("critic",))
    calls: list[list[str]] = []

    def runner(argv: Sequence[str]) -> int:
        calls.append(list(argv))
        if "never,always" in ",".join(argv):  # the main phase fills MUR's records
            write_mur(Path(argv[argv.index("--out") + 1]), 2, steps=3, scaled=1)
        return 0

    assert run_table(table, runner, prog=PROG) == 0
    gates = [argv[argv.index("--gate") + 1] for argv in calls]
    assert gates == [",".join(MAIN_GATES), "random@0.5", "mur"]


def test_a_failed_phase_stops_the_table_and_says_how_to_go_on(tmp_path: Path) -> None:
    calls: list[Sequence[str]] = []
    with pytest.raises(Table1Error, match=r"critic / main stopped \(mur solve exit 1\).*rerun"):
        run_table(plan(tmp_path), lambda argv: calls.append(argv) or 1, prog=PROG)
    assert len(calls) == 1


def test_a_stopped_phase_stops_the_table_with_130_not_as_a_failure(tmp_path: Path, capsys) -> None:
    calls: list[Sequence[str]] = []
    assert run_table(plan(tmp_path), lambda argv: calls.append(argv) or 130, prog=PROG) == 130
    assert len(calls) == 1
    assert "critic / main stopped; its finished questions are saved" in capsys.readouterr().err


# A stand-in for `mur solve`: ready once its handlers are set, exit 130 on the first stop signal.
CHILD = """
import pathlib, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
pathlib.Path(sys.argv[1]).touch()
time.sleep(60)
sys.exit(0)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_run_mur_passes_a_stop_signal_on_and_waits_for_the_child(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Under pytest stdin is no terminal, so a Ctrl-C could not reach the child by itself."""
    ready = tmp_path / "ready"

    def signal_when_ready() -> None:
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), sig)

    before = signal.getsignal(sig)
    threading.Thread(target=signal_when_ready, daemon=True).start()
    assert run_mur([str(ready)], program=(sys.executable, "-c", CHILD)) == 130
    assert signal.getsignal(sig) is before


def test_cli_dry_run_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--results", str(tmp_path), "--tag", "m", "--strategies", "critic", "--dry-run"]
    assert main([*args, "--", "--max-steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "--gate never,always,mur,mur+bc,average,smart --gamma 0.9" in out
    assert "--concurrency" not in out  # mur measures it on the servers
    assert "--gamma 0.7,0.8,0.95 --max-steps 8 --out" in out
    profiles = ["--profile", "cpu-tiny", "--verifier-profile", "cpu-tiny"]
    pair = ["--gates", "never,always,mur", *profiles]
    assert "# critic / main (0 of 600 runs recorded)\nmur solve --strategy critic" in out
    assert "# critic / random (0 of 100 runs recorded): the random baseline needs MUR's" in out
    damaged = Path(out.split("--out ")[1].split()[0])  # the main phase's folder
    damaged.mkdir(parents=True)
    (damaged / "records.jsonl").write_text("oops\n")
    assert main(args) == 2  # its progress cannot be counted: named, not a traceback
    assert "records.jsonl line 1 is not JSON" in capsys.readouterr().err
    (damaged / "records.jsonl").unlink()
    assert main([*args, *pair, "--concurrency", "4", "--sweep", ""]) == 0
    out = capsys.readouterr().out
    assert "--gate never,always,mur --gamma 0.9 --concurrency 4 --profile cpu-tiny" in out
    assert "--verifier-profile cpu-tiny --out" in out and "sweep" not in out
    assert main(["--strategies", "critic,beam", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mur experiment table1: unknown strategy 'beam': "
        "choose one of critic, best_of_n, foresight, thinking, escalate"
    )
    with pytest.raises(SystemExit) as exited:  # the parser's, as for every command's --profile
        main([*args, "--profile", "nope"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("mur experiment table1: error: argument --profile: unknown server "
                          "profile 'nope': choose one of cpu-qwen-0.5b, ")  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--gates", "mur,bogus"], "--gates bogus: unknown gate 'bogus': choose one of never, "),
        (["--gamma", "0"], "--gamma 0: gamma must be greater than 0, got 0.0"),
    ],
)
def test_settings_mur_solve_refuses_stop_the_table_before_anything_runs(
    flags: list[str],
    error: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By mur solve's own check (the Context's), with and without --dry-run: exit 2, one line
    naming the flag and the value, no phase printed or started."""

    def no_command(*args: object, **kwargs: object) -> None:
        raise AssertionError("no mur solve may start for bad settings")

    monkeypatch.setattr(table1.subprocess, "Popen", no_command)
    for dry_run in ([], ["--dry-run"]):
        assert main(["--results", str(tmp_path), *flags, *dry_run]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith(f"mur experiment table1: {error}")
        assert len(captured.err.splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_the_mur_command_is_the_one_beside_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A virtualenv's own `mur solve`, whether or not the environment is activated."""
    (tmp_path / "python").touch()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(Table1Error, match=r"mur command is not installed beside .*make setup"):
        mur_program()
    (tmp_path / "mur").touch()
    assert mur_program() == [str(tmp_path / "mur"), "solve"]


def test_the_dataset_comes_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dataset", "gsm8k", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mur experiment table1: unknown dataset 'gsm8k': "
        "choose one of math500, aime24, aime25, gpqa_diamond"
    )
