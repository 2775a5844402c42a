"""Every experiment's committed report comes back from its committed records with the same
decisions and figures: moving an experiment or changing a layer it shares cannot shift a
result unseen. Each case is the command its report names (`mur report ...`), run on a copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mur.cli.compare import main as compare
from mur.cli.report import main

ROOT = Path(__file__).resolve().parents[2]
BRANCH_ARMS = [
    "--live=mur=results/math500-branch-mur-1.5b",
    "--live=random=results/math500-branch-random-1.5b",
    "--live=eager=results/math500-branch-eager-1.5b",
]
CASES = {
    # the paper's table, on the 1.5B (experiments/table1.py): rows, headline, gamma sweep
    "table1": ("results/math500-critic-qwen2.5-coder-1.5b", []),
    # experiments/parallel_traces.py
    "parallel-traces": ("results/math500-traces-1.5b", ["--prereg", "parallel-traces"]),
    # experiments/online_check.py: mur-esc live against its replays
    "online-check": (
        "results/math500-traces-1.5b-online",
        ["--predicted-by", "results/math500-traces-1.5b"],
    ),
    # experiments/branching_fresh.py
    "branching-fresh": (
        "results/math500-traces-1.5b-fresh",
        ["--prereg", "branching-fresh", *BRANCH_ARMS],
    ),
}
COMBINED = "results/small-backbone-external-judge"
COMBINED_SOURCES = [
    f"results/math500-{strategy}-0.5b-judge-1.5b"
    for strategy in ("critic", "foresight", "thinking", "best_of_n")
]


def _copy_records(folder: str, to: Path) -> Path:
    """The folder's records and settings, without its report."""
    to.mkdir()
    for path in (ROOT / folder).iterdir():
        if path.name.startswith("records") or path.name == "settings.json":
            shutil.copy(path, to / path.name)
    return to


def _same_report(made: Path, committed: str, shown_as: str) -> None:
    assert json.loads((made / "report.json").read_text()) == json.loads(
        (ROOT / committed / "report.json").read_text()
    )
    markdown = (made / "report.md").read_text().replace(str(made), shown_as)
    assert markdown == (ROOT / committed / "report.md").read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_committed_report_regenerates_the_same(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, flags = CASES[case]
    monkeypatch.chdir(ROOT)
    copy = _copy_records(folder, tmp_path / Path(folder).name)
    assert main([str(copy), *flags]) == 0
    _same_report(copy, folder, folder)


def test_the_combined_report_regenerates_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """experiments/small_backbone.py: H1-H3 over four folders combined."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "combined"
    assert main([*COMBINED_SOURCES, "--out", str(out)]) == 0
    _same_report(out, COMBINED, COMBINED)


def test_the_int8_comparison_regenerates_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """results/prereg-int8.md is decided by `mur compare --margin`: one non-inferiority line
    over the two folders' first 4 samples, and its reported-not-decided list."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "compare.md"
    bf16, int8 = "results/math500-traces-1.5b", "results/math500-traces-1.5b-w8a8"
    assert compare([bf16, int8, "--samples", "4", "--margin", "-2", "--out", str(out)]) == 0
    assert out.read_text() == (ROOT / int8 / "compare.md").read_text()
